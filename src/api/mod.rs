//! The SQL-facing functions. Each one checks its arguments (so bad input is rejected before
//! anything is written) and hands over to [`crate::storage`].
//!
//! A function's grant and comment that the SQL edition shares are in `sql/surface/<function>.sql`,
//! included here by `extension_sql_file!` and by the edition's manifest (one source for both). Each
//! file starts with a blank line, as the `extension_sql!` string it replaced did, so that the
//! generated schema stays the released one (`scripts/check-schema`).
mod admin;
mod args;
mod batch;
mod derive;
mod distribute;
mod grants;
mod keys;
mod maintenance;
mod observe;
mod offsets;
mod one_row;
mod partitions;
