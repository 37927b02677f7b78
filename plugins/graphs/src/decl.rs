//! The [`graph!`] declaration every graph of this plugin is written with.

/// Declares a graph: a unit struct and its `GraphImpl` with `NAME`,
/// `DESCRIPTION`, `TABLES` (and `TABLES_WITH_COLUMNS` when given after
/// `columns`) and a `new` that takes no settings written out, and the
/// items of the braces (`render`) for the rest. A graph of one `table`
/// gives its `render(collection, table, out)` body alone: the collection
/// and its table are read first.
macro_rules! graph {
    (
        $(#[$meta:meta])*
        pub struct $name:ident = $graph:literal, $desc:literal;
        table $table:literal;
        render($c:ident, $t:ident, $out:ident) $body:block
    ) => {
        graph! {
            $(#[$meta])*
            pub struct $name = $graph, $desc;
            tables &[$table];
            {
                fn render(&mut self, data: GraphData<'_>, $out: &Path) -> Result<Vec<PathBuf>> {
                    let $c = $crate::data::Collection::new(data)?;
                    let $t = $c.table($table)?;
                    $body
                }
            }
        }
    };
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
