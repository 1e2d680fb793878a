//! Protocol options: settings that belong to one protocol (Tiga's headroom, 2PL's conflict
//! policy, ...), declared by the protocol as [`OptionSpec`]s and given as `name = value` pairs
//! from command-line flags, cluster files and experiment files.
//!
//! [`ProtocolOptions::parse`] refuses an option the chosen protocol does not have, and a value
//! out of range or not among the choices, naming the option and what is accepted. Nothing
//! starts with a bad option.

use meridian_core::ConfigError;
use std::collections::BTreeMap;
use std::fmt;

/// What values an option takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionKind {
    /// A number in `min..=max`.
    Number {
        /// Smallest accepted.
        min: f64,
        /// Largest accepted.
        max: f64,
        /// Used when not given.
        default: f64,
    },
    /// One of these names.
    Choice {
        /// Accepted names.
        values: &'static [&'static str],
        /// Used when not given.
        default: &'static str,
    },
}

/// One option a protocol accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptionSpec {
    /// Its name, prefixed with the protocol's (`occ-one-round`, `tiga-headroom-ms`).
    pub name: &'static str,
    /// What it does, for `--help` and errors.
    pub help: &'static str,
    /// Its values.
    pub kind: OptionKind,
}

/// A validated option value.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    /// A number.
    Number(f64),
    /// A choice.
    Choice(&'static str),
}

impl fmt::Display for OptionValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Choice(c) => f.write_str(c),
        }
    }
}

/// The options of one run: every option of the chosen protocol, given or defaulted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProtocolOptions {
    values: BTreeMap<&'static str, OptionValue>,
}

impl ProtocolOptions {
    /// Validates `given` (name, value text) against `specs` (the protocol `protocol`'s
    /// options) and fills in the defaults.
    pub fn parse(
        protocol: &str,
        specs: &'static [OptionSpec],
        given: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut values: BTreeMap<&'static str, OptionValue> = specs
            .iter()
            .map(|spec| {
                let value = match spec.kind {
                    OptionKind::Number { default, .. } => OptionValue::Number(default),
                    OptionKind::Choice { default, .. } => OptionValue::Choice(default),
                };
                (spec.name, value)
            })
            .collect();
        let mut seen = Vec::new();
        for (name, text) in given {
            let Some(spec) = specs.iter().find(|s| s.name == name) else {
                let accepted = if specs.is_empty() {
                    "none".to_string()
                } else {
                    specs.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
                };
                return Err(ConfigError::new(format!(
                    "option '{name}' does not apply to protocol {protocol}; its options: {accepted}"
                )));
            };
            if seen.contains(&spec.name) {
                return Err(ConfigError::new(format!("option '{name}' is given twice")));
            }
            seen.push(spec.name);
            let value = match spec.kind {
                OptionKind::Number { min, max, .. } => {
                    let number: f64 = text.trim().parse().map_err(|_| {
                        ConfigError::new(format!(
                            "option '{name}' = '{text}' is not a number; accepted: {min} to {max}"
                        ))
                    })?;
                    if !(number.is_finite() && (min..=max).contains(&number)) {
                        return Err(ConfigError::new(format!(
                            "option '{name}' = {text} is out of range; accepted: {min} to {max}"
                        )));
                    }
                    OptionValue::Number(number)
                }
                OptionKind::Choice { values: choices, .. } => {
                    let Some(&choice) = choices.iter().find(|c| **c == text.trim()) else {
                        return Err(ConfigError::new(format!(
                            "option '{name}' = '{text}' is not accepted; accepted: {}",
                            choices.join(", ")
                        )));
                    };
                    OptionValue::Choice(choice)
                }
            };
            values.insert(spec.name, value);
        }
        Ok(Self { values })
    }

    /// A number option's value: as given, or the default `specs` declares for it (options
    /// built without parsing, as in unit tests, hold no values). Panics on a name `specs`
    /// does not declare as a number: a bug in the protocol, not input.
    pub fn number(&self, name: &str, specs: &[OptionSpec]) -> f64 {
        match (self.values.get(name), spec_of(specs, name).kind) {
            (Some(OptionValue::Number(n)), _) => *n,
            (None, OptionKind::Number { default, .. }) => default,
            other => panic!("option {name} is not a number option: {other:?}"),
        }
    }

    /// A choice option's value: as given, or the default `specs` declares for it.
    pub fn choice(&self, name: &str, specs: &[OptionSpec]) -> &'static str {
        match (self.values.get(name), spec_of(specs, name).kind) {
            (Some(OptionValue::Choice(c)), _) => c,
            (None, OptionKind::Choice { default, .. }) => default,
            other => panic!("option {name} is not a choice option: {other:?}"),
        }
    }

    /// Every option and its value, for reports.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &OptionValue)> {
        self.values.iter().map(|(&k, v)| (k, v))
    }
}

fn spec_of<'a>(specs: &'a [OptionSpec], name: &str) -> &'a OptionSpec {
    specs.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no option {name} declared"))
}

/// Parses `name=value` (a command-line `--protocol-option`).
pub fn parse_pair(text: &str) -> Result<(String, String), ConfigError> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(ConfigError::new(format!("'{text}' is not name=value"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[OptionSpec] = &[
        OptionSpec {
            name: "x-headroom-ms",
            help: "headroom",
            kind: OptionKind::Number { min: 0.0, max: 1_000.0, default: 10.0 },
        },
        OptionSpec {
            name: "x-mode",
            help: "mode",
            kind: OptionKind::Choice { values: &["a", "b"], default: "a" },
        },
    ];

    fn given(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_fill_in_and_given_values_are_checked() {
        let options = ProtocolOptions::parse("x", SPECS, &[]).unwrap();
        assert_eq!(options.number("x-headroom-ms", SPECS), 10.0);
        assert_eq!(options.choice("x-mode", SPECS), "a");
        let unparsed = ProtocolOptions::default();
        assert_eq!(unparsed.number("x-headroom-ms", SPECS), 10.0);
        let options = ProtocolOptions::parse(
            "x",
            SPECS,
            &given(&[("x-headroom-ms", "2.5"), ("x-mode", "b")]),
        )
        .unwrap();
        assert_eq!(options.number("x-headroom-ms", SPECS), 2.5);
        assert_eq!(options.choice("x-mode", SPECS), "b");
    }

    #[test]
    fn bad_options_name_the_option_and_what_is_accepted() {
        let error = |pairs: &[(&str, &str)]| {
            ProtocolOptions::parse("x", SPECS, &given(pairs)).unwrap_err().0
        };
        let e = error(&[("x-headroom-ms", "5000")]);
        assert!(e.contains("x-headroom-ms") && e.contains("0 to 1000"), "{e}");
        let e = error(&[("x-headroom-ms", "NaN")]);
        assert!(e.contains("out of range"), "{e}");
        let e = error(&[("x-headroom-ms", "ten")]);
        assert!(e.contains("not a number"), "{e}");
        let e = error(&[("x-mode", "c")]);
        assert!(e.contains("accepted: a, b"), "{e}");
        let e = error(&[("tiga-headroom-ms", "1")]);
        assert!(e.contains("does not apply to protocol x") && e.contains("x-mode"), "{e}");
        let e = error(&[("x-mode", "a"), ("x-mode", "b")]);
        assert!(e.contains("twice"), "{e}");
        let e = ProtocolOptions::parse("y", &[], &given(&[("y-z", "1")])).unwrap_err().0;
        assert!(e.contains("its options: none"), "{e}");
        assert!(parse_pair("a=1").is_ok() && parse_pair("=1").is_err() && parse_pair("a").is_err());
    }
}
