//! The file of the last clean shutdown: the counters survive one. The postmaster writes them to
//! `pg_stat/idempotency.stat` when it exits, and reads (then removes) that file when it starts (both
//! hooked by [`super::shmem`]). After a crash they start at 0. Rows whose counters are all 0 and rows
//! of dropped databases are not written: a restart frees their slots, which is the only way a slot is
//! ever freed.
use super::counters::COUNTERS;
use super::hash::hash_of;
use super::names::read_name;
use super::region::{attached, header, slot};
use super::slots::{add_all, own_slot, shared_slot};
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

const DUMP_FILE: &str = "pg_stat/idempotency.stat";
/// Version 2 stores each slot's key; version 1 (0.4.0) did not, and is still read.
const DUMP_MAGIC: &[u8; 8] = b"IDEMST02";
const DUMP_MAGIC_V1: &[u8; 8] = b"IDEMST01";

/// Postmaster exit: keeps the counters for the next start, after a clean shutdown only.
#[pgrx::pg_guard]
pub(super) unsafe extern "C-unwind" fn save_at_exit(code: std::ffi::c_int, _arg: pg_sys::Datum) {
    if code != 0 || !attached() {
        return;
    }
    if let Err(e) = save() {
        pgrx::log!("idempotency: could not write {DUMP_FILE}: {e}");
    }
}

/// A slot as written to the file of the last clean shutdown.
#[derive(Debug, PartialEq, Eq)]
struct Saved {
    db: u32,
    shared: bool,
    /// The slot's key; None in a file of version 1, whose rows are hashed again by name.
    key: Option<u64>,
    name: String,
    reset_at: i64,
    counts: [u64; COUNTERS],
}

fn save() -> std::io::Result<()> {
    let mut known = std::collections::HashMap::new();
    let mut exists = |db| *known.entry(db).or_insert_with(|| database_exists(std::path::Path::new("."), db));
    let saved: Vec<Saved> = (0..header().slots as usize)
        .map(slot)
        .filter(|s| s.ready.load(Ordering::Acquire) != 0)
        .map(|s| Saved {
            db: s.db.load(Ordering::Relaxed),
            shared: s.shared.load(Ordering::Relaxed) == 1,
            key: Some(s.key.load(Ordering::Relaxed)),
            name: read_name(s),
            reset_at: s.reset_at.load(Ordering::Relaxed),
            counts: std::array::from_fn(|c| s.counts[c].load(Ordering::Relaxed)),
        })
        // Slots are never freed while the server runs: leaving out the empty rows (reset, or never
        // counted) and those of dropped databases frees their slots at the next start.
        .filter(|r| r.counts.iter().any(|&n| n != 0) && exists(r.db))
        .collect();
    let tmp = format!("{DUMP_FILE}.tmp");
    std::fs::write(&tmp, encode(&saved))?;
    std::fs::rename(tmp, DUMP_FILE)
}

/// Whether database `db` still has its directory under `data_dir` (the postmaster, which has no
/// catalog access, runs in the data directory): `base/<oid>`, or `<oid>` in a tablespace's version
/// directory for a database made in another tablespace. True when in doubt.
fn database_exists(data_dir: &std::path::Path, db: u32) -> bool {
    let name = db.to_string();
    let base = data_dir.join("base");
    if !base.is_dir() || base.join(&name).exists() {
        return true;
    }
    let Ok(spaces) = std::fs::read_dir(data_dir.join("pg_tblspc")) else {
        return true;
    };
    // pg_tblspc/<tablespace>/PG_<version>_<catalog version>/<database>
    spaces.flatten().any(|space| {
        std::fs::read_dir(space.path())
            .into_iter()
            .flatten()
            .flatten()
            .any(|version| version.path().join(&name).exists())
    })
}

/// Server start: takes back the counters of the last clean shutdown, then removes the file (so a
/// crash later does not bring back stale counts).
pub(super) fn load() {
    let Ok(bytes) = std::fs::read(DUMP_FILE) else {
        return;
    };
    let _ = std::fs::remove_file(DUMP_FILE);
    let Some(saved) = decode(&bytes) else {
        pgrx::log!("idempotency: ignored {DUMP_FILE}: not a statistics file of this version");
        return;
    };
    for row in saved {
        // By the saved key: a long scope's name is cut, so hashing the name would give another key.
        let key = row.key.unwrap_or_else(|| hash_of(row.db, &row.name, false));
        let own = if row.shared { None } else { own_slot(key, row.db, &row.name) };
        if let Some(i) = own.or_else(|| shared_slot(row.db)) {
            add_all(i, &row.counts);
            slot(i).reset_at.store(row.reset_at, Ordering::Relaxed);
        }
    }
}

/// The file: a magic, how many counters each row has, then the rows, little-endian.
fn encode(rows: &[Saved]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(DUMP_MAGIC);
    out.extend_from_slice(&(COUNTERS as u32).to_le_bytes());
    for r in rows {
        out.extend_from_slice(&r.db.to_le_bytes());
        out.push(r.shared as u8);
        out.extend_from_slice(&r.key.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&(r.name.len() as u32).to_le_bytes());
        out.extend_from_slice(r.name.as_bytes());
        out.extend_from_slice(&r.reset_at.to_le_bytes());
        for c in &r.counts {
            out.extend_from_slice(&c.to_le_bytes());
        }
    }
    out
}

/// The rows of a file, None when it is not one (or is cut short). A file of a version with fewer
/// counters leaves the new ones at 0; one with more drops those this version does not know. A file
/// of version 1 has no keys.
fn decode(bytes: &[u8]) -> Option<Vec<Saved>> {
    let mut r = Reader(bytes);
    let with_keys = match r.take(8)? {
        magic if magic == DUMP_MAGIC => true,
        magic if magic == DUMP_MAGIC_V1 => false,
        _ => return None,
    };
    let stored = r.u32()? as usize;
    let mut rows = Vec::new();
    while !r.0.is_empty() {
        let db = r.u32()?;
        let shared = r.take(1)?[0] == 1;
        let key = match with_keys {
            true => Some(r.u64()?).filter(|&k| k != 0),
            false => None,
        };
        let len = r.u32()? as usize;
        let name = std::str::from_utf8(r.take(len)?).ok()?.to_owned();
        let reset_at = r.u64()? as i64;
        let mut counts = [0u64; COUNTERS];
        for i in 0..stored {
            let n = r.u64()?;
            if let Some(c) = counts.get_mut(i) {
                *c = n;
            }
        }
        rows.push(Saved { db, shared, key, name, reset_at, counts });
    }
    Some(rows)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;
    use crate::stats::region::NAME_BYTES;

    fn row(db: u32, name: &str, shared: bool, n: u64) -> Saved {
        Saved {
            db,
            shared,
            key: Some(0xabcd_0000 + n),
            name: name.into(),
            reset_at: 7_000_000 + n as i64,
            counts: std::array::from_fn(|i| n * 100 + i as u64),
        }
    }

    #[test]
    fn a_file_reads_back_as_written() {
        let rows =
            vec![row(16384, "payments", false, 1), row(16384, "", true, 2), row(5, "é-ü 😀", false, 3)];
        assert_eq!(decode(&encode(&rows)), Some(rows));
        assert_eq!(decode(&encode(&[])), Some(vec![]));
    }

    #[test]
    fn a_file_keeps_the_key_of_a_cut_name() {
        // The key is the hash of the full name, which the cut name cannot give back.
        let cut = Saved { key: Some(u64::MAX - 1), ..row(1, &"s".repeat(NAME_BYTES), false, 4) };
        let rows = decode(&encode(std::slice::from_ref(&cut))).expect("readable");
        assert_eq!(rows[0].key, Some(u64::MAX - 1));
        assert_eq!(rows, vec![cut]);
    }

    #[test]
    fn a_damaged_or_foreign_file_is_refused() {
        let bytes = encode(&[row(1, "a", false, 1), row(1, "b", false, 2)]);
        for cut in [0, 4, 8, 11, 20, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut foreign = bytes.clone();
        foreign[0] = b'X';
        assert_eq!(decode(&foreign), None);
        let mut future = bytes.clone();
        future[7] = b'3';
        assert_eq!(decode(&future), None, "a later version's file");
    }

    #[test]
    fn a_version_1_file_is_read_without_keys_and_other_counters() {
        // Written by 0.4.0 (no keys), by a version with 3 counters only.
        let mut bytes = DUMP_MAGIC_V1.to_vec();
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.push(b's');
        bytes.extend_from_slice(&42i64.to_le_bytes());
        for n in [10u64, 20, 30] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        let rows = decode(&bytes).expect("readable");
        assert_eq!(rows[0].counts[..3], [10, 20, 30]);
        assert!(rows[0].counts[3..].iter().all(|&n| n == 0));
        assert_eq!((rows[0].db, rows[0].key, rows[0].name.as_str(), rows[0].reset_at), (9, None, "s", 42));
    }

    #[test]
    fn a_dropped_database_is_one_without_its_directory() {
        let dir = std::env::temp_dir().join(format!("idem-stats-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(database_exists(&dir, 5), "not a data directory: keep everything");
        std::fs::create_dir_all(dir.join("base/5")).unwrap();
        std::fs::create_dir_all(dir.join("pg_tblspc/16400/PG_15_202209061/7")).unwrap();
        let found: Vec<bool> = [5, 6, 7].iter().map(|&db| database_exists(&dir, db)).collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, [true, false, true]);
    }
}
