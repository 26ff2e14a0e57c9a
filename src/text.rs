//! Bounded text: the lists and messages written into a `ScheduledEvent`'s
//! status and into Kubernetes Events name a few items and count the rest,
//! so that an event naming thousands of VMs (or pods) writes small objects
//! and builds small strings.

/// How many items a condition message names before it counts the rest.
pub const NAMED_IN_MESSAGE: usize = 20;

/// The longest condition message written, in bytes (Kubernetes' own
/// `metav1.Condition` allows 32,768; ours stay far below).
pub const MESSAGE_LIMIT: usize = 4096;

/// The first `limit` of `items` joined with `sep`, and ` and N more` when
/// some were left out: `a, b, c and 7 more`. Only the named items are
/// copied.
pub fn named<S: AsRef<str>>(items: &[S], limit: usize, sep: &str) -> String {
    let mut out = items
        .iter()
        .take(limit)
        .map(AsRef::as_ref)
        .collect::<Vec<&str>>()
        .join(sep);
    let more = items.len().saturating_sub(limit);
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

/// The first `limit` of `items`, and, when some were left out, an entry
/// `and N more <what>` at the end. Only the kept items are copied.
pub fn listed_at_most(items: &[String], limit: usize, what: &str) -> Vec<String> {
    let mut listed: Vec<String> = items.iter().take(limit).cloned().collect();
    let more = items.len().saturating_sub(limit);
    if more > 0 {
        listed.push(format!("and {more} more {what}"));
    }
    listed
}

/// `text` cut at a character boundary to at most `max` bytes, ending in `…`
/// when cut.
pub fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

#[cfg(test)]
mod tests {
    use super::{cut, listed_at_most, named};

    #[test]
    fn long_lists_name_a_few_and_count_the_rest() {
        let items: Vec<String> = (0..5).map(|i| format!("ns/p{i}")).collect();
        assert_eq!(
            listed_at_most(&items, 3, "pods terminating"),
            ["ns/p0", "ns/p1", "ns/p2", "and 2 more pods terminating"]
        );
        assert_eq!(listed_at_most(&items, 5, "x"), items);
    }

    #[test]
    fn names_a_few_and_counts_the_rest() {
        let items: Vec<String> = (0..5).map(|i| format!("vm_{i}")).collect();
        assert_eq!(named(&items, 2, ", "), "vm_0, vm_1 and 3 more");
        assert_eq!(named(&items, 5, "; "), "vm_0; vm_1; vm_2; vm_3; vm_4");
        assert_eq!(named::<String>(&[], 3, ", "), "");
    }

    #[test]
    fn cuts_at_a_character_boundary() {
        assert_eq!(cut("short".into(), 10), "short");
        let long = "é".repeat(10); // 20 bytes
        let c = cut(long, 8);
        assert!(c.len() <= 8, "{c}");
        assert!(c.ends_with('…'));
        assert_eq!(c, "éé…");
    }
}
