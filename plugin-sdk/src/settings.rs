//! A component's settings: one struct whose `Default` is the defaults users
//! see (`kernmlops config defaults` prints them, serialised, with each
//! field's doc comment as its comment), parsed from the host's JSON with
//! errors that name the key, and checked by the component's own rules
//! before anything runs.
//!
//! ```ignore
//! kernmlops_plugin_sdk::settings! {
//!     /// `[probes.block_io]` settings.
//!     pub struct BlockIoSettings {
//!         /// Requests tracked between issue and completion, over all disks.
//!         pub inflight_entries: u32 = 65536,
//!     }
//!     validate(s) {
//!         if s.inflight_entries == 0 {
//!             return Err("inflight_entries must be at least 1".into());
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::{Error, Result};

/// What every settings struct provides; [`settings!`](crate::settings)
/// implements it.
pub trait Settings: Serialize + DeserializeOwned + Default + Send + 'static {
    /// `(key, comment)` for each field, in declaration order.
    fn docs() -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// Rules beyond types (ranges, non-empty lists), each error naming the
    /// key.
    fn validate(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// Settings of a component that has none: any key is an error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoSettings {}

impl Settings for NoSettings {}

/// The defaults of `S` as the body of its TOML table, each key preceded by
/// its doc comment. Empty for settings without keys.
pub fn defaults_toml<S: Settings>() -> String {
    let table = match toml::Table::try_from(S::default()) {
        Ok(t) => t,
        Err(e) => return format!("# (defaults could not be shown: {e})\n"),
    };
    let mut out = String::new();
    let mut keys: Vec<&String> = table.keys().collect();
    // Declaration order where documented, then the rest as serialised.
    let order = |k: &str| S::docs().iter().position(|(d, _)| *d == k);
    keys.sort_by_key(|k| order(k).unwrap_or(usize::MAX));
    for key in keys {
        if let Some((_, doc)) = S::docs().iter().find(|(d, _)| d == key) {
            for line in doc.lines() {
                let line = line.strip_prefix(' ').unwrap_or(line);
                out.push_str(format!("# {line}").trim_end());
                out.push('\n');
            }
        }
        let mut one = toml::Table::new();
        one.insert(key.clone(), table[key].clone());
        match toml::to_string(&one) {
            Ok(text) if !text.trim_start().starts_with('[') => out.push_str(&text),
            // A sub-table: keep it inline so the body stays one table.
            _ => out.push_str(&format!("{key} = {}\n", table[key])),
        }
    }
    out
}

/// Parses a component's settings from the host's JSON (`{}` or empty for
/// the defaults) and applies its rules. `section` (`[probes.block_io]`)
/// starts every error, which is of kind config.
pub fn parse<S: Settings>(section: &str, json: &str) -> Result<S> {
    let text = json.trim();
    let settings: S = if text.is_empty() {
        S::default()
    } else {
        serde_json::from_str(text).map_err(|e| {
            // The position is in the host's JSON, not the user's file.
            let e = e.to_string();
            let e = e.rsplit_once(" at line ").map_or(e.as_str(), |(m, _)| m);
            Error::config(format!("{section}: {e}"))
        })?
    };
    settings
        .validate()
        .map_err(|e| Error::config(format!("{section}: {e}")))?;
    Ok(settings)
}

/// A duration in settings, written as text (`"1s"`, `"500ms"`, `"2m"`),
/// parsed in one place for host and plugins alike.
pub use kernmlops_sys::duration::HumanDuration;

/// Declares a settings struct: fields with doc comments and defaults, and
/// optionally a `validate(s) { ... }` block returning `Result<(), String>`.
/// Expands to the struct (serde, unknown keys refused, missing keys
/// defaulted), its `Default` and its [`Settings`] implementation.
///
/// A first field marked `#[flatten]` (no default: its own `Default`) is
/// another settings struct whose keys sit in the same table, documented
/// and checked by its own declaration before this one's rules: the
/// machine settings every benchmark shares
/// ([`MachineSettings`](crate::benchmark::MachineSettings)).
#[macro_export]
macro_rules! settings {
    ($($body:tt)*) => {
        $crate::__settings_with_serde! { "kernmlops_plugin_sdk::__private::serde", $($body)* }
    };
}

/// [`settings!`] with the path serde's derive uses to name serde, for crates
/// that re-export this macro (`kernmlops-plugin-bpf`): the plugin using it
/// need not depend on serde or on this crate directly.
#[doc(hidden)]
#[macro_export]
macro_rules! __settings_with_serde {
    // One expansion for both forms below; `[...]` holds the flattened
    // field, if any.
    (
        @expand $serde:literal,
        [$(#[$meta:meta])*] $vis:vis $name:ident
        [$($flvis:vis $flat:ident : $flty:ty)?]
        {
            $(
                $(#[doc = $doc:literal])*
                $fvis:vis $field:ident : $fty:ty = $default:expr
            ),* $(,)?
        }
        $(validate($s:ident) $body:block)?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, $crate::__private::serde::Serialize, $crate::__private::serde::Deserialize)]
        #[serde(deny_unknown_fields, default, crate = $serde)]
        $vis struct $name {
            $(
                #[serde(flatten)]
                $flvis $flat: $flty,
            )?
            $(
                $(#[doc = $doc])*
                $fvis $field: $fty,
            )*
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                Self {
                    $($flat: ::core::default::Default::default(),)?
                    $($field: $default,)*
                }
            }
        }

        impl $crate::settings::Settings for $name {
            fn docs() -> &'static [(&'static str, &'static str)] {
                static DOCS: ::std::sync::OnceLock<::std::vec::Vec<(&'static str, &'static str)>> =
                    ::std::sync::OnceLock::new();
                DOCS.get_or_init(|| {
                    #[allow(unused_mut)]
                    let mut docs = ::std::vec::Vec::new();
                    $(docs.extend_from_slice(<$flty as $crate::settings::Settings>::docs());)?
                    docs.extend_from_slice(&[$((stringify!($field), concat!($($doc, "\n"),*))),*]);
                    docs
                })
            }

            fn validate(&self) -> ::core::result::Result<(), ::std::string::String> {
                $($crate::settings::Settings::validate(&self.$flat)?;)?
                $(
                    let $s = self;
                    let rules: ::core::result::Result<(), ::std::string::String> = $body;
                    rules?;
                )?
                ::core::result::Result::Ok(())
            }
        }
    };
    (
        $serde:literal,
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            #[flatten]
            $flvis:vis $flat:ident : $flty:ty,
            $($fields:tt)*
        }
        $($rules:tt)*
    ) => {
        $crate::__settings_with_serde! {
            @expand $serde, [$(#[$meta])*] $vis $name [$flvis $flat : $flty] { $($fields)* } $($rules)*
        }
    };
    (
        $serde:literal,
        $(#[$meta:meta])*
        $vis:vis struct $name:ident { $($fields:tt)* }
        $($rules:tt)*
    ) => {
        $crate::__settings_with_serde! {
            @expand $serde, [$(#[$meta])*] $vis $name [] { $($fields)* } $($rules)*
        }
    };
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    crate::settings! {
        /// Settings of a test component.
        pub struct Demo {
            /// Time between two samples.
            /// At least 10ms.
            pub interval: HumanDuration = HumanDuration::from_secs(1),
            /// Entries tracked.
            pub entries: u32 = 64,
            /// Names to watch.
            pub names: Vec<String> = vec!["a".into()],
        }
        validate(s) {
            if s.entries == 0 {
                return Err("entries must be at least 1".into());
            }
            Ok(())
        }
    }

    #[test]
    fn defaults_are_the_struct_default_with_comments() {
        let text = defaults_toml::<Demo>();
        assert_eq!(
            text,
            "# Time between two samples.\n# At least 10ms.\ninterval = \"1s\"\n# Entries tracked.\nentries = 64\n# Names to watch.\nnames = [\"a\"]\n"
        );
        let back: toml::Table = toml::from_str(&text).expect("TOML");
        let json = serde_json::to_string(&back).expect("json");
        assert_eq!(
            parse::<Demo>("[x]", &json).expect("parses"),
            Demo::default()
        );
    }

    #[test]
    fn errors_name_the_section_and_key() {
        let e = parse::<Demo>("[probes.demo]", r#"{"bogus":1}"#).expect_err("unknown");
        assert_eq!(e.kind, crate::api::ErrorKind::CONFIG);
        assert!(
            e.message
                .starts_with("[probes.demo]: unknown field `bogus`"),
            "{e}"
        );
        let e = parse::<Demo>("[probes.demo]", r#"{"entries":0}"#).expect_err("rule");
        assert_eq!(e.message, "[probes.demo]: entries must be at least 1");
        let e = parse::<Demo>("[probes.demo]", r#"{"interval":"5 parsecs"}"#).expect_err("unit");
        assert!(
            e.message.contains("interval") || e.message.contains("parsecs"),
            "{e}"
        );
        assert_eq!(
            parse::<Demo>("[x]", r#"{"interval":"250ms"}"#)
                .expect("ok")
                .interval
                .get(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn no_settings_refuses_any_key() {
        assert!(parse::<NoSettings>("[x]", "{}").is_ok());
        assert!(parse::<NoSettings>("[x]", "").is_ok());
        assert!(parse::<NoSettings>("[x]", r#"{"a":1}"#).is_err());
        assert_eq!(defaults_toml::<NoSettings>(), "");
    }
}
