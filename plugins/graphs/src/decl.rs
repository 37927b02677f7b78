//! The [`graph!`] declaration every graph of this plugin is written with.

/// Declares a graph: a unit struct and its `GraphImpl` with `NAME`,
/// `DESCRIPTION`, `TABLES` (and `TABLES_WITH_COLUMNS` when given after
/// `columns`) and a `new` that takes no settings written out, and the
/// items of the braces (`render`) for the rest.
macro_rules! graph {
    (
        $(#[$meta:meta])*
        pub struct $name:ident = $graph:literal, $desc:literal;
        tables $tables:expr;
        $( columns $columns:expr; )?
        { $($items:tt)* }
    ) => {
        $(#[$meta])*
        pub struct $name;

        impl GraphImpl for $name {
            const NAME: &'static str = $graph;
            const DESCRIPTION: &'static str = $desc;
            const TABLES: &'static [&'static str] = $tables;
            $( const TABLES_WITH_COLUMNS: &'static [&'static str] = $columns; )?

            fn new(_args: &StartArgs) -> Result<Self> {
                Ok(Self)
            }

            $($items)*
        }
    };
}
