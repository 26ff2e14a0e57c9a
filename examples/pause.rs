//! The pod sandbox ("pause") process of the real-node harness
//! (`hack/real-node.sh`): waits for SIGTERM or SIGINT, then exits 0. Built
//! static and packed as the image containerd's `sandbox_image` names, so the
//! real node runs without any registry.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    forewarn::cli::shutdown_signal().await;
}
