//! Broker positions stored in the consumer's own transaction.
//!
//! One row per (consumer_group, topic, partition) in a small unpartitioned table with a low
//! fillfactor, so that the constant updates of the same rows stay HOT. Retention never touches it.
//! A row lock (`FOR UPDATE`) serializes concurrent writers of one partition's position: the
//! second sees the first's result.
use super::pg::spi::{arg, Conn, Snap, Stmt};
use crate::errors;
use pgrx::pg_sys;

const T_TEXT: pg_sys::Oid = pg_sys::TEXTOID;
const T_INT4: pg_sys::Oid = pg_sys::INT4OID;
const T_INT8: pg_sys::Oid = pg_sys::INT8OID;

static LOCK_ROW: Stmt = Stmt {
    sql: "SELECT next_offset, generation FROM idempotency.offsets
           WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE",
    args: &[T_TEXT, T_TEXT, T_INT4],
};
static INSERT_ROW: Stmt = Stmt {
    sql: "INSERT INTO idempotency.offsets (consumer_group, topic, partition, next_offset, generation, updated_at)
          VALUES ($1, $2, $3, $4, $5, clock_timestamp())
          ON CONFLICT (consumer_group, topic, partition) DO NOTHING",
    args: &[T_TEXT, T_TEXT, T_INT4, T_INT8, T_INT8],
};
static UPDATE_ROW: Stmt = Stmt {
    sql: "UPDATE idempotency.offsets SET next_offset = $4, generation = $5, updated_at = clock_timestamp()
           WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
    args: &[T_TEXT, T_TEXT, T_INT4, T_INT8, T_INT8],
};
static NEXT: Stmt = Stmt {
    sql: "SELECT next_offset FROM idempotency.offsets
           WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
    args: &[T_TEXT, T_TEXT, T_INT4],
};
static LIST: Stmt = Stmt {
    sql: "SELECT topic, partition, next_offset, generation, updated_at FROM idempotency.offsets
           WHERE consumer_group = $1 AND ($2::text IS NULL OR topic = $2)
           ORDER BY topic, partition",
    args: &[T_TEXT, T_TEXT],
};

/// One partition's position.
#[derive(Clone, Copy)]
pub struct Position<'a> {
    pub group: &'a str,
    pub topic: &'a str,
    pub partition: i32,
}

/// Locks the position's row, creating it with `init` when absent. Returns the stored
/// (next_offset, generation), or None when the row was just created from `init`.
fn lock_or_create(
    conn: &Conn,
    p: Position,
    init: i64,
    generation: Option<i64>,
) -> Option<(i64, Option<i64>)> {
    let key = [arg(p.group), arg(p.topic), arg(p.partition)];
    loop {
        let rows = conn.run(&LOCK_ROW, &key, Snap::Statement);
        if rows.len() == 1 {
            return Some((rows.get(0, 1).expect("next_offset"), rows.get(0, 2)));
        }
        let inserted = conn.run(
            &INSERT_ROW,
            &[arg(p.group), arg(p.topic), arg(p.partition), arg(init), arg(generation)],
            Snap::Statement,
        );
        if inserted.len() == 1 {
            return None;
        }
        // Someone else inserted it concurrently and committed: lock their row.
    }
}

/// Advances the position past `processed`. Returns false (and changes nothing but a newer
/// generation) when `processed` is not beyond the stored position.
pub fn record(p: Position, processed: i64, generation: Option<i64>) -> bool {
    let next =
        processed.checked_add(1).unwrap_or_else(|| errors::out_of_range("processed_offset", processed));
    let conn = Conn::open();
    let Some((stored_next, stored_gen)) = lock_or_create(&conn, p, next, generation) else {
        return true;
    };
    if let (Some(stored), Some(given)) = (stored_gen, generation) {
        if given < stored {
            errors::fenced(p.group, p.topic, p.partition, given, stored);
        }
    }
    let new_gen = generation.or(stored_gen);
    let advances = next > stored_next;
    if advances || new_gen != stored_gen {
        conn.run(
            &UPDATE_ROW,
            &[arg(p.group), arg(p.topic), arg(p.partition), arg(stored_next.max(next)), arg(new_gen)],
            Snap::Statement,
        );
    }
    advances
}

/// Where to seek on restart: last processed + 1, or None when nothing is stored.
pub fn next(p: Position) -> Option<i64> {
    let conn = Conn::open();
    let rows = conn.run(&NEXT, &[arg(p.group), arg(p.topic), arg(p.partition)], Snap::Statement);
    if rows.len() == 0 {
        None
    } else {
        rows.get(0, 1)
    }
}

/// Sets the position, backwards or forwards, keeping the generation.
pub fn reset(p: Position, next_offset: i64, generation: Option<i64>) {
    let conn = Conn::open();
    if let Some((_, stored)) = lock_or_create(&conn, p, next_offset, generation) {
        conn.run(
            &UPDATE_ROW,
            &[arg(p.group), arg(p.topic), arg(p.partition), arg(next_offset), arg(generation.or(stored))],
            Snap::Statement,
        );
    }
}

pub struct Listed {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
    pub generation: Option<i64>,
    pub updated_at: pg_sys::TimestampTz,
}

pub fn list(group: &str, topic: Option<&str>) -> Vec<Listed> {
    let conn = Conn::open();
    let rows = conn.run(&LIST, &[arg(group), arg(topic)], Snap::Statement);
    (0..rows.len())
        .map(|i| Listed {
            topic: rows.get(i, 1).expect("topic"),
            partition: rows.get(i, 2).expect("partition"),
            next_offset: rows.get(i, 3).expect("next_offset"),
            generation: rows.get(i, 4),
            updated_at: rows.get_ts(i, 5).expect("updated_at"),
        })
        .collect()
}
