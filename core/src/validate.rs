//! Validation of what plugins declare, before anything runs. The rules are
//! the specification in `kernmlops_plugin_api::spec`, shared with plugin
//! crates' own tests so both check the same thing.

pub use kernmlops_plugin_api::spec::*;
