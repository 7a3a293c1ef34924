//! Scope names as a slot keeps and shows them. A slot has room for [`NAME_BYTES`] of a name; a longer
//! scope is counted under its full name (its slot's key) and shows cut, with a hash of the full name.
//! Also the cut at a character boundary, which the rounds' error messages use as well.
use super::hash::pg_hash;
use super::region::{Slot, NAME_BYTES};
use std::sync::atomic::Ordering;

/// The name a scope's row shows: the scope itself when it fits in NAME_BYTES; else its first bytes,
/// `~` and 16 hex digits of `hashtextextended(scope, 0)`, so that long scopes with the same beginning
/// show apart (and their Prometheus label sets differ).
pub(super) fn shown_name(scope: &str) -> std::borrow::Cow<'_, str> {
    if scope.len() <= NAME_BYTES {
        return scope.into();
    }
    cut_name(scope, pg_hash(scope.as_bytes(), 0)).into()
}

fn cut_name(scope: &str, hash: u64) -> String {
    let suffix = format!("~{hash:016x}");
    let cut = floor_char_boundary(scope, NAME_BYTES - suffix.len());
    format!("{}{suffix}", &scope[..cut])
}

pub(super) fn write_name(s: &Slot, name: &[u8]) {
    let name = &name[..name.len().min(NAME_BYTES)];
    for (i, word) in s.name.iter().enumerate() {
        let mut bytes = [0u8; 8];
        for (j, b) in bytes.iter_mut().enumerate() {
            *b = name.get(i * 8 + j).copied().unwrap_or(0);
        }
        word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
    }
    s.name_len.store(name.len() as u32, Ordering::Relaxed);
}

pub(super) fn read_name(s: &Slot) -> String {
    let mut bytes: Vec<u8> = s.name.iter().flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes()).collect();
    bytes.truncate(s.name_len.load(Ordering::Relaxed) as usize);
    // A cut scope may end inside a character.
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The length of the longest beginning of `s` that has at most `max` bytes and ends at a character
/// boundary.
pub(super) fn floor_char_boundary(s: &str, max: usize) -> usize {
    (0..=max.min(s.len())).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_cut_with_a_hash_of_the_whole() {
        let long = "x".repeat(200);
        let a = cut_name(&long, 0x0123_4567_89ab_cdef);
        assert_eq!(a, format!("{}~0123456789abcdef", "x".repeat(NAME_BYTES - 17)));
        assert_ne!(a, cut_name(&long, 1), "two scopes with the same beginning show apart");
        assert_eq!(cut_name(&long, 1).len(), NAME_BYTES);
        // Cut at a character's boundary: 2-byte characters, 111 bytes left for them.
        let wide = cut_name(&"é".repeat(100), 7);
        assert_eq!(wide, format!("{}~0000000000000007", "é".repeat(55)));
    }
}
