//! Counter tables: a struct of `u64` counters declared once, with the names
//! and help text every reader derives from it.
//!
//! xvs publishes the same counters in several places: the worker's shared
//! live block (an array of atomics), the snapshot, the stop line, `/metrics`
//! and `xvsadm` output. Each of them iterates over the table instead of
//! naming fields, so adding a counter is one line in the declaration.
//!
//! Invariants of a generated type `T`:
//! - `T::NAMES[i]`, `T::HELP[i]` and `T::METRICS[i]` describe the `i`-th
//!   field in declaration order, and `values()[i]` is its value;
//!   `from_array(values())` is the identity.
//! - `NAMES` (stop-line keys, JSON) and `METRICS` (Prometheus families) are
//!   interfaces: renaming one breaks operators' parsers and dashboards.
//!
//! Written as a macro rather than taken from a crate: the metrics crates
//! keep a registry of live metric objects behind locks or atomics, while
//! these counters are plain fields a worker increments without either and
//! publishes once per batch.

/// Declares a struct of `u64` counters and its field table.
///
/// Each field: doc comments (the help text), the field name, optionally
/// `as "key"` (the stop-line and JSON key when it is not the field's name)
/// and `=> "family"` (the Prometheus family; `""` for none). After the
/// counters, `extra { ... }` may declare other fields (not counted in the
/// table; they need `Default`, `Copy`, `Eq` and `Debug`).
#[macro_export]
macro_rules! counter_table {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $doc:literal])+
                $field:ident $(as $key:literal)? => $metric:literal,
            )*
        }
        $(extra {
            $(
                $(#[doc = $xdoc:literal])+
                $xfield:ident : $xty:ty,
            )*
        })?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $name {
            $( $(#[doc = $doc])+ pub $field: u64, )*
            $($( $(#[doc = $xdoc])+ pub $xfield: $xty, )*)?
        }

        impl $name {
            /// Number of counters in the table.
            pub const LEN: usize = [$(stringify!($field)),*].len();
            /// Each counter's key (stop line, JSON).
            pub const NAMES: [&'static str; Self::LEN] =
                [$($crate::__counter_key!($($key)?, $field)),*];
            /// Each counter's help text (its doc comment).
            pub const HELP: [&'static str; Self::LEN] = [$(concat!($($doc),+)),*];
            /// Each counter's Prometheus family (`""`: none).
            pub const METRICS: [&'static str; Self::LEN] = [$($metric),*];

            /// The counters in table order.
            pub fn values(&self) -> [u64; Self::LEN] {
                [$(self.$field),*]
            }

            /// The inverse of [`Self::values`] (extra fields at their
            /// defaults).
            #[allow(clippy::needless_update)] // no extra fields
            pub fn from_array(v: [u64; Self::LEN]) -> Self {
                let [$($field),*] = v;
                Self {
                    $($field,)*
                    ..Self::default()
                }
            }

            /// Adds another reading's counters to these (extra fields
            /// untouched).
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
            }

            /// `(key, value)` in table order.
            pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.into_iter().zip(self.values())
            }
        }
    };
}

/// The key of a table field: its `as` literal, else its name.
#[doc(hidden)]
#[macro_export]
macro_rules! __counter_key {
    ($key:literal, $field:ident) => {
        $key
    };
    (, $field:ident) => {
        stringify!($field)
    };
}

#[cfg(test)]
mod tests {
    #![allow(unreachable_pub)]

    counter_table! {
        /// A test table.
        struct T {
            /// First.
            a => "xvs_a_total",
            /// Second,
            /// on two lines.
            b as "bee" => "",
        }
        extra {
            /// Not a counter.
            c: [u8; 2],
        }
    }

    #[test]
    fn the_table_describes_the_fields_in_order() {
        let t = T {
            a: 1,
            b: 2,
            c: [3, 4],
        };
        assert_eq!(T::LEN, 2);
        assert_eq!(T::NAMES, ["a", "bee"]);
        assert_eq!(T::METRICS, ["xvs_a_total", ""]);
        assert_eq!(T::HELP, [" First.", " Second, on two lines."]);
        assert_eq!(t.values(), [1, 2]);
        assert_eq!(T::from_array([1, 2]), T { c: [0; 2], ..t });
        assert_eq!(t.named().collect::<Vec<_>>(), [("a", 1), ("bee", 2)]);
        let mut u = t;
        u.add(&t);
        assert_eq!(
            u,
            T {
                a: 2,
                b: 4,
                c: [3, 4]
            }
        );
    }
}
