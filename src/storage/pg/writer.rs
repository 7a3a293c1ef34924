//! The one row writer: every new record (a claim, `idem_once`, a batch's keys) is written here, with
//! every column's value given. Directly with the access methods when the partition allows it (see
//! `direct`), else with the same values through the executor's INSERT (a partition with triggers,
//! constraints or columns of a DBA's, pg_partman's default partition, a row outside the range).
use super::direct;
pub use super::direct::Row;
use super::spi::{arg, ts_arg, Conn, Snap, Stmt};
use pgrx::pg_sys;

static INSERT_ROW: Stmt = Stmt {
    sql: "INSERT INTO {partition}
                 (scope, key, status, token, attempts, fingerprint, payload, created_at, updated_at, expires_at)
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    args: &[
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::TEXTOID,
        pg_sys::INT8OID,
        pg_sys::INT4OID,
        pg_sys::TEXTOID,
        pg_sys::JSONBOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
        pg_sys::TIMESTAMPTZOID,
    ],
};

/// Writes `row` into `partition` (or into the record table itself, which routes it). The caller holds
/// the key's lock and has locked the partition for the insert (`partitions::insert_target`).
pub fn insert(conn: &Conn, partition: pg_sys::Oid, row: &Row) {
    insert_all(conn, partition, std::slice::from_ref(row));
}

/// [`insert`] of several rows of distinct keys into one partition: written together when the partition
/// allows direct inserts, else one statement each.
pub fn insert_all(conn: &Conn, partition: pg_sys::Oid, rows: &[Row]) {
    if !direct::insert_all(partition, rows) {
        for row in rows {
            insert_by_statement(conn, partition, row);
        }
    }
}

fn insert_by_statement(conn: &Conn, partition: pg_sys::Oid, row: &Row) {
    let args = [
        arg(row.scope),
        arg(row.key),
        arg(row.status),
        arg(row.token),
        arg(row.attempts),
        arg(row.fingerprint),
        row.payload,
        ts_arg(row.created_at),
        ts_arg(row.updated_at),
        row.expires_at.and_then(ts_arg),
    ];
    conn.run_on(&INSERT_ROW, partition, &args, Snap::Statement);
}
