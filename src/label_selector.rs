//! Kubernetes label selectors as the policy file writes them
//! (`matchLabels` and `matchExpressions`), with the semantics of
//! `metav1.LabelSelector` (k8s.io/apimachinery `LabelSelectorAsSelector`):
//! every `matchLabels` entry and every expression must hold; an empty
//! selector (`{}`) matches every object.
//!
//! An own type rather than k8s-openapi's `LabelSelector`, whose
//! deserializer accepts unknown keys and any operator: the policy refuses a
//! misspelt key (`matchLabel`) or operator (`in`), as Helm does through the
//! chart's values schema generated from this type, and as the API server
//! refuses them in a Kubernetes object.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A label selector: `matchLabels` and `matchExpressions`, all of which
/// must hold (`metav1.LabelSelector`). `{}` matches everything.
///
/// ```yaml
/// matchLabels:
///   kubernetes.azure.com/scalesetpriority: spot
/// matchExpressions:
///   - {key: team, operator: In, values: [shop, search]}
///   - {key: forewarn.dev/skip, operator: DoesNotExist}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels the object must carry with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on the object's labels, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

/// One requirement of `matchExpressions` (`metav1.LabelSelectorRequirement`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirement {
    /// The label's key.
    pub key: String,
    /// How the label's value is compared with `values`.
    pub operator: Operator,
    /// The values: at least one for `In` and `NotIn`, none for `Exists` and
    /// `DoesNotExist` (the API server's validation of a LabelSelector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The operators of a `matchExpressions` requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Operator {
    /// The label is present and its value is one of `values`.
    In,
    /// The label is absent, or its value is none of `values`.
    NotIn,
    /// The label is present, whatever its value.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl Operator {
    /// Its name, as in the policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
        }
    }
}

impl Requirement {
    /// Whether `labels` meet the requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }

    /// The API server's rule on `values`: at least one for `In` and
    /// `NotIn`, none for `Exists` and `DoesNotExist`; and a key. The
    /// fault, if any.
    fn check(&self) -> Result<(), String> {
        if self.key.is_empty() {
            return Err("a matchExpressions entry has an empty key".into());
        }
        let wants_values = matches!(self.operator, Operator::In | Operator::NotIn);
        if wants_values && self.values.is_empty() {
            return Err(format!(
                "matchExpressions key {}: operator {} needs at least one value",
                self.key,
                self.operator.as_str()
            ));
        }
        if !wants_values && !self.values.is_empty() {
            return Err(format!(
                "matchExpressions key {}: operator {} takes no values",
                self.key,
                self.operator.as_str()
            ));
        }
        Ok(())
    }
}

impl LabelSelector {
    /// Whether an object with `labels` is selected: every `matchLabels`
    /// entry present with its value, and every expression met. An empty
    /// selector selects everything.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// Whether the selector is one the API server would accept: every
    /// expression with a key, and values exactly where its operator takes
    /// them. The first fault, for the policy's error.
    pub fn check(&self) -> Result<(), String> {
        self.match_expressions
            .iter()
            .try_for_each(Requirement::check)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse(yaml: &str) -> LabelSelector {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = parse("{}");
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn match_labels_need_every_pair_with_its_value() {
        let s = parse("matchLabels: {pool: spot, zone: '1'}");
        assert!(s.matches(&labels(&[("pool", "spot"), ("zone", "1"), ("x", "y")])));
        assert!(!s.matches(&labels(&[("pool", "spot")])));
        assert!(!s.matches(&labels(&[("pool", "system"), ("zone", "1")])));
    }

    #[test]
    fn in_needs_the_label_with_one_of_the_values() {
        let s = parse("matchExpressions: [{key: pool, operator: In, values: [spot, batch]}]");
        assert!(s.matches(&labels(&[("pool", "spot")])));
        assert!(s.matches(&labels(&[("pool", "batch")])));
        assert!(!s.matches(&labels(&[("pool", "system")])));
        assert!(!s.matches(&labels(&[])), "an absent label is not In");
    }

    #[test]
    fn not_in_takes_an_absent_label_or_another_value() {
        let s = parse("matchExpressions: [{key: pool, operator: NotIn, values: [system]}]");
        assert!(s.matches(&labels(&[("pool", "spot")])));
        assert!(s.matches(&labels(&[])), "an absent label is NotIn");
        assert!(!s.matches(&labels(&[("pool", "system")])));
    }

    #[test]
    fn exists_and_does_not_exist_look_at_the_key_only() {
        let exists = parse("matchExpressions: [{key: gpu, operator: Exists}]");
        assert!(exists.matches(&labels(&[("gpu", "")])));
        assert!(exists.matches(&labels(&[("gpu", "a100")])));
        assert!(!exists.matches(&labels(&[("cpu", "x")])));
        let absent = parse("matchExpressions: [{key: gpu, operator: DoesNotExist}]");
        assert!(!absent.matches(&labels(&[("gpu", "")])));
        assert!(absent.matches(&labels(&[("cpu", "x")])));
    }

    #[test]
    fn labels_and_expressions_must_all_hold() {
        let s = parse(
            "matchLabels: {pool: spot}\nmatchExpressions:\n- {key: team, operator: In, values: [shop]}\n- {key: skip, operator: DoesNotExist}\n",
        );
        assert!(s.matches(&labels(&[("pool", "spot"), ("team", "shop")])));
        assert!(!s.matches(&labels(&[
            ("pool", "spot"),
            ("team", "shop"),
            ("skip", "1")
        ])));
        assert!(!s.matches(&labels(&[("pool", "spot"), ("team", "web")])));
        assert!(!s.matches(&labels(&[("team", "shop")])));
    }

    #[test]
    fn values_where_the_operator_takes_none_or_needs_some_are_refused() {
        let e = parse("matchExpressions: [{key: a, operator: In}]")
            .check()
            .unwrap_err();
        assert!(e.contains("needs at least one value"), "{e}");
        let e = parse("matchExpressions: [{key: a, operator: NotIn, values: []}]")
            .check()
            .unwrap_err();
        assert!(e.contains("needs at least one value"), "{e}");
        let e = parse("matchExpressions: [{key: a, operator: Exists, values: [x]}]")
            .check()
            .unwrap_err();
        assert!(e.contains("takes no values"), "{e}");
        let e = parse("matchExpressions: [{key: '', operator: Exists}]")
            .check()
            .unwrap_err();
        assert!(e.contains("empty key"), "{e}");
        assert!(
            parse("matchExpressions: [{key: a, operator: DoesNotExist}]")
                .check()
                .is_ok()
        );
    }

    #[test]
    fn unknown_keys_and_operators_are_refused() {
        assert!(serde_saphyr::from_str::<LabelSelector>("matchLabel: {a: b}").is_err());
        assert!(
            serde_saphyr::from_str::<LabelSelector>(
                "matchExpressions: [{key: a, operator: in, values: [b]}]"
            )
            .is_err()
        );
    }
}
