//! The naming rule for tables, columns, probes and plugins:
//! `lowercase_snake_case` starting with a letter, ASCII only, no double or
//! trailing underscore.

/// Why `name` is not snake_case, as a phrase to put after the name
/// ("is empty", "must start with a lowercase letter", ...); `None` when it
/// is.
pub fn snake_case_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("is empty".to_owned())
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        Some("must start with a lowercase letter".to_owned())
    } else if let Some(c) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_'))
    {
        Some(format!(
            "has {c:?}: use lowercase letters, digits and underscores"
        ))
    } else if name.ends_with('_') || name.contains("__") {
        Some("must be snake_case: no double or trailing underscore".to_owned())
    } else {
        None
    }
}

/// True for `lowercase_snake_case` starting with a letter.
pub fn is_snake_case(name: &str) -> bool {
    snake_case_problem(name).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_snake_case() {
        for ok in ["a", "quanta_runtime", "dtlb_misses2", "a1_b2_c3"] {
            assert_eq!(snake_case_problem(ok), None, "{ok}");
            assert!(is_snake_case(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else_with_the_reason() {
        for (bad, reason) in [
            ("", "is empty"),
            ("_a", "must start with a lowercase letter"),
            ("2a", "must start with a lowercase letter"),
            ("Ab", "must start with a lowercase letter"),
            ("é", "must start with a lowercase letter"),
            ("aB", "has 'B'"),
            ("a-b", "has '-'"),
            ("a b", "has ' '"),
            ("aé", "has 'é'"),
            ("a_", "no double or trailing underscore"),
            ("a__b", "no double or trailing underscore"),
        ] {
            let got = snake_case_problem(bad).unwrap_or_default();
            assert!(got.contains(reason), "{bad:?}: got {got:?}");
            assert!(!is_snake_case(bad), "{bad:?} should be refused");
        }
    }
}
