//! What every comparison benchmark's report shares: a target an issue sets
//! for a measured ratio, and how a figure that may be missing is printed.

/// One comparison an issue sets a target for.
#[derive(Debug, Clone)]
pub struct Target {
    pub what: String,
    pub value: f64,
    /// The bound and whether it is a floor (>=) or a ceiling (<=).
    pub bound: f64,
    pub at_least: bool,
}

impl Target {
    /// Whether the value meets the bound, compared as printed (3 decimals),
    /// so a report never says "0.500 (target >= 0.5): missed".
    pub fn met(&self) -> bool {
        let v = (self.value * 1000.0).round() / 1000.0;
        if self.at_least {
            v >= self.bound
        } else {
            v <= self.bound
        }
    }
}

/// The report's `targets` block (empty when the run had no peer a target
/// compares): one line per target, its value, bound and verdict.
pub fn render_targets(targets: &[Target]) -> String {
    if targets.is_empty() {
        return String::new();
    }
    let mut s = String::from("\ntargets\n");
    for t in targets {
        s += &format!(
            "  {}: {:.3} (target {} {}): {}\n",
            t.what,
            t.value,
            if t.at_least { ">=" } else { "<=" },
            t.bound,
            if t.met() { "met" } else { "MISSED" }
        );
    }
    s
}

/// `v` with `digits` decimals, or "-" when it was not measured.
pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_compare_as_printed() {
        let t = |value, bound, at_least| Target { what: String::new(), value, bound, at_least }.met();
        assert!(t(0.4996, 0.5, true), "prints 0.500");
        assert!(!t(0.4994, 0.5, true));
        assert!(t(0.1004, 0.1, false));
        assert!(!t(0.1006, 0.1, false));
        assert_eq!(render_targets(&[]), "");
        let block = render_targets(&[Target { what: "A".into(), value: 0.25, bound: 0.5, at_least: true }]);
        assert_eq!(block, "\ntargets\n  A: 0.250 (target >= 0.5): MISSED\n");
        assert_eq!(fmt_opt(None, 2), "-");
        assert_eq!(fmt_opt(Some(1.234), 1), "1.2");
    }
}
