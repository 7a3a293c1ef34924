//! The membership filter's arithmetic: a split block Bloom filter as Parquet specifies it (32-byte
//! blocks of eight 32-bit words, one bit set per word by eight fixed salts) over the key lock's 64-bit
//! hash. Its format is on disk and part of the upgrade contract: see `lifecycle::sealing` for why
//! filters exist and how they are written, and `pg::sealed` for how claims read them. Also the bits'
//! place in a backend's memory ([`Bits`]) and the hint that loads a block ahead of its test.
pub const BLOCK_BYTES: usize = 32;
/// Blocks per row of `idempotency.filter_chunks`: 7,936 bytes, so that a row fills one 8 kB page.
pub const CHUNK_BLOCKS: usize = 248;
const BITS_PER_KEY: u64 = 15;
/// Parquet's split block Bloom filter salts.
const SALT: [u32; 8] =
    [0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31];

/// Blocks for a filter of `keys` keys (at least one).
pub fn blocks_for(keys: u64) -> u32 {
    (keys * BITS_PER_KEY).div_ceil(BLOCK_BYTES as u64 * 8).max(1) as u32
}

/// The block a hash falls in: its high half scaled to the number of blocks.
pub fn block_of(hash: u64, blocks: u32) -> usize {
    (((hash >> 32) * blocks as u64) >> 32) as usize
}

/// The bit each of the block's eight words must have, from the hash's low half.
fn masks(hash: u64) -> [u32; 8] {
    let low = hash as u32;
    SALT.map(|salt| 1u32 << (low.wrapping_mul(salt) >> 27))
}

/// Whether a block (32 bytes, little-endian words) may hold the hash.
pub fn block_has(block: &[u8], hash: u64) -> bool {
    masks(hash).iter().enumerate().all(|(i, m)| {
        let word = u32::from_le_bytes(block[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        word & m != 0
    })
}

/// Adds a hash to a filter of `bits.len() / 32` blocks.
pub fn insert(bits: &mut [u8], hash: u64) {
    let blocks = (bits.len() / BLOCK_BYTES) as u32;
    let at = block_of(hash, blocks) * BLOCK_BYTES;
    for (i, m) in masks(hash).iter().enumerate() {
        let word = &mut bits[at + i * 4..at + i * 4 + 4];
        let v = u32::from_le_bytes((&*word).try_into().expect("4 bytes")) | m;
        word.copy_from_slice(&v.to_le_bytes());
    }
}

/// The cache line a copy of the bits is aligned on.
const CACHE_LINE: usize = 64;

/// A filter's bits in a backend's memory, each block inside one cache line (a test then loads one line, not
/// two): the allocation is a line longer, and the bits start at its first line boundary. Zeroed by the
/// allocator (calloc: pages fresh from the system stay untouched until written).
pub struct Bits {
    raw: Box<[u8]>,
    at: usize,
    len: usize,
}

impl Bits {
    pub fn zeroed(len: usize) -> Bits {
        let raw = vec![0u8; len + CACHE_LINE].into_boxed_slice();
        let at = raw.as_ptr().align_offset(CACHE_LINE).min(CACHE_LINE);
        Bits { raw, at, len }
    }
}

impl std::ops::Deref for Bits {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.at..self.at + self.len]
    }
}

impl std::ops::DerefMut for Bits {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}

/// A hint to the CPU to load the cache line at `at` (no fault, no effect on what the program computes);
/// nothing where there is no such instruction.
#[inline(always)]
pub fn prefetch_read(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees, whatever the address; SSE is
    // part of x86_64's baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed-seed stream of well-mixed 64-bit values (splitmix64), standing in for key hashes.
    fn hashes(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_add(0x9e3779b97f4a7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
                z ^ (z >> 31)
            })
            .collect()
    }

    fn filter_of(keys: &[u64]) -> Vec<u8> {
        let mut bits = vec![0u8; blocks_for(keys.len() as u64) as usize * BLOCK_BYTES];
        for h in keys {
            insert(&mut bits, *h);
        }
        bits
    }

    fn holds(bits: &[u8], h: u64) -> bool {
        let at = block_of(h, (bits.len() / BLOCK_BYTES) as u32) * BLOCK_BYTES;
        block_has(&bits[at..at + BLOCK_BYTES], h)
    }

    #[test]
    fn never_says_no_for_an_inserted_key() {
        for n in [1, 7, 1000, 100_000] {
            let keys = hashes(n as u64, n);
            let bits = filter_of(&keys);
            assert!(keys.iter().all(|h| holds(&bits, *h)), "a false no among {n} keys");
        }
    }

    #[test]
    fn false_maybe_rate_is_about_a_fifth_of_a_percent() {
        let keys = hashes(1, 200_000);
        let bits = filter_of(&keys);
        let others = hashes(2, 200_000);
        let maybes = others.iter().filter(|h| holds(&bits, **h)).count();
        let rate = maybes as f64 / others.len() as f64;
        assert!(rate < 0.003, "false maybe rate {rate}");
        assert!(rate > 0.0005, "suspiciously few false maybes: {rate}");
    }

    #[test]
    fn copies_keep_each_block_in_one_cache_line() {
        for len in [32, 7_936, 1_875_008] {
            let mut bits = Bits::zeroed(len);
            assert_eq!(bits.len(), len);
            assert_eq!(bits.as_ptr() as usize % CACHE_LINE, 0, "{len} bytes");
            assert!(bits.iter().all(|b| *b == 0));
            bits[len - 1] = 1;
            assert_eq!(bits[len - 1], 1);
        }
    }

    #[test]
    fn size_is_fifteen_bits_a_key() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(1_000_000) as usize * BLOCK_BYTES, 1_875_008);
        assert!(CHUNK_BLOCKS * BLOCK_BYTES + 64 < 8160, "a chunk row fits one heap page");
    }
}
