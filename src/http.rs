//! The process's HTTP clients (reqwest over rustls with ring).
//!
//! reqwest is built with `rustls-no-provider`: every client takes the
//! process-wide rustls crypto provider, and building one before a provider
//! is installed panics. [`client_builder`] installs ring first (once; a
//! provider installed earlier is kept), so every client of the product and
//! of its tests is built through it.

/// Installs ring as the process's rustls crypto provider, unless one is
/// installed already. Idempotent and cheap after the first call.
pub fn ensure_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another provider was installed first: it is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A `reqwest::ClientBuilder` with the crypto provider installed that
/// trusts the public roots only ([`public_roots`]). Not the platform's
/// store: the image has none, and reqwest's platform verifier then refuses
/// to build any client at all, even one that only speaks plain HTTP (IMDS).
pub fn client_builder() -> reqwest::ClientBuilder {
    bare_builder().tls_certs_only(public_roots())
}

/// A `reqwest::ClientBuilder` with the crypto provider installed and no
/// root yet: the caller must give its own with `tls_certs_only` (building
/// it without would look for the platform's store).
pub fn bare_builder() -> reqwest::ClientBuilder {
    ensure_crypto_provider();
    reqwest::Client::builder()
}

/// A default `reqwest::Client` (system proxy settings, the public roots),
/// for tests and tools.
///
/// # Panics
/// When the HTTP stack cannot be set up at all (as `reqwest::Client::new`).
pub fn client() -> reqwest::Client {
    client_builder()
        .build()
        .expect("the HTTP client could not be built")
}

/// Mozilla's root certificates (webpki-root-certs), for clients that talk
/// to the internet from an image with no CA store (the webhooks).
/// Parsed once per process.
pub fn public_roots() -> Vec<reqwest::Certificate> {
    static ROOTS: std::sync::OnceLock<Vec<reqwest::Certificate>> = std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .filter_map(|c| reqwest::Certificate::from_der(c.as_ref()).ok())
                .collect()
        })
        .clone()
}

#[cfg(test)]
mod tests {
    #[test]
    fn clients_build_and_the_public_roots_are_there() {
        let _ = super::client();
        let roots = super::public_roots();
        assert!(roots.len() > 100, "{} roots", roots.len());
        super::bare_builder()
            .tls_certs_only(roots)
            .build()
            .expect("a client with only the public roots");
    }
}
