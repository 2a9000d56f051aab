//! The fuzzer's randomness and its mutations of request frames.
//!
//! Every input is generated from its own generator, seeded from (seed, input index) alone, so any
//! input can be regenerated without the ones before it.

/// A splitmix64 generator: tiny, fast and fully determined by its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// The generator of input `index` of the run seeded with `seed`.
    pub fn for_input(seed: u64, index: u64) -> Rng {
        Rng(mix(seed ^ mix(index.wrapping_add(0x9e37_79b9_7f4a_7c15))))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Values that break arithmetic and length checks, for fields of each width.
const I16S: &[i16] = &[-1, 0, 1, 0x7f, 0x80, 0xff, 0x7ffe, 0x7fff, i16::MIN];
const I32S: &[i32] = &[
    -1,
    0,
    1,
    0x7f,
    0xff,
    0x7fff,
    0x8000,
    0xffff,
    0x0010_0000,
    0x7fff_fffe,
    i32::MAX,
    i32::MIN,
];
const I64S: &[i64] = &[
    -1,
    0,
    1,
    i32::MAX as i64,
    u32::MAX as i64,
    1 << 32,
    i64::MAX,
    i64::MAX - 1,
    i64::MIN,
    i64::MIN + 1,
];
/// Unsigned varints (compact lengths and counts of flexible versions): 0 (null), 1 (empty), the
/// largest one-byte value, and ones that decode to huge or overlong values.
const UVARINTS: &[&[u8]] = &[
    &[0x00],
    &[0x01],
    &[0x7f],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    &[0xff, 0xff, 0xff, 0xff, 0x07],
    &[0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
];

/// Size prefixes that lie: outside the accepted range, or disagreeing with the bytes that follow.
fn lying_size(rng: &mut Rng, actual: usize) -> i32 {
    let actual = actual as i32;
    match rng.below(10) {
        0 => -1,
        1 => 0,
        2 => 7,
        3 => 8,
        4 => i32::MAX,
        5 => 100 << 20,       // the default --max-request-bytes
        6 => (100 << 20) + 1, // one over it
        7 => actual.saturating_add(1 + rng.below(64) as i32),
        8 => (actual - 1 - rng.below(actual.max(1) as usize) as i32).max(0),
        _ => i32::MIN,
    }
}

/// Applies 1-3 random mutations to `frame` (a whole request frame, size prefix first), using `other`
/// (another valid frame) for splices. Returns the bytes to send and a note of what was done.
pub fn mutate(rng: &mut Rng, frame: &[u8], other: &[u8]) -> (Vec<u8>, Vec<String>) {
    let mut body = frame[4..].to_vec();
    let mut notes = Vec::new();
    let mut size_lie = None;
    let mut tail: Vec<u8> = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let n = body.len();
        match rng.below(14) {
            0 => {
                let flips = 1 + rng.below(8);
                for _ in 0..flips {
                    if n > 0 {
                        let at = rng.below(n);
                        body[at] ^= 1 << rng.below(8);
                    }
                }
                notes.push(format!("{flips} bit flips"));
            }
            1 if n > 0 => {
                let at = rng.below(n);
                body[at] = rng.next_u64() as u8;
                notes.push(format!("byte {at} set"));
            }
            2 if n >= 2 => {
                let at = rng.below(n - 1);
                let v = *rng.pick(I16S);
                body[at..at + 2].copy_from_slice(&v.to_be_bytes());
                notes.push(format!("i16 {v} at {at}"));
            }
            3 if n >= 4 => {
                let at = rng.below(n - 3);
                let v = *rng.pick(I32S);
                body[at..at + 4].copy_from_slice(&v.to_be_bytes());
                notes.push(format!("i32 {v} at {at}"));
            }
            4 if n >= 8 => {
                let at = rng.below(n - 7);
                let v = *rng.pick(I64S);
                body[at..at + 8].copy_from_slice(&v.to_be_bytes());
                notes.push(format!("i64 {v} at {at}"));
            }
            5 => {
                // A length or count field: an i16 or i32 whose value could describe what follows.
                let width = if rng.one_in(2) { 2 } else { 4 };
                let candidates: Vec<usize> = (8..n.saturating_sub(width - 1))
                    .filter(|&at| {
                        let v = if width == 2 {
                            i16::from_be_bytes([body[at], body[at + 1]]) as i64
                        } else {
                            i32::from_be_bytes(body[at..at + 4].try_into().unwrap()) as i64
                        };
                        (0..=(n - at) as i64).contains(&v)
                    })
                    .collect();
                if !candidates.is_empty() {
                    let at = *rng.pick(&candidates);
                    if width == 2 {
                        let v = *rng.pick(I16S);
                        body[at..at + 2].copy_from_slice(&v.to_be_bytes());
                        notes.push(format!("length i16 {v} at {at}"));
                    } else {
                        let v = *rng.pick(I32S);
                        body[at..at + 4].copy_from_slice(&v.to_be_bytes());
                        notes.push(format!("length i32 {v} at {at}"));
                    }
                }
            }
            6 if n > 8 => {
                // A compact (varint) length or count: replace one small byte with an extreme varint.
                let at = 8 + rng.below(n - 8);
                let v = *rng.pick(UVARINTS);
                body.splice(at..at + 1, v.iter().copied());
                notes.push(format!("varint {v:02x?} at {at}"));
            }
            7 if n > 0 => {
                let keep = rng.below(n);
                body.truncate(keep);
                notes.push(format!("truncated to {keep}"));
            }
            8 => {
                let at = rng.below(n + 1);
                let len = 1 + rng.below(16);
                let extra = rng.bytes(len);
                notes.push(format!("{} bytes inserted at {at}", extra.len()));
                body.splice(at..at, extra);
            }
            9 if n > 0 => {
                let at = rng.below(n);
                let len = 1 + rng.below((n - at).min(32));
                body.drain(at..at + len);
                notes.push(format!("{len} bytes removed at {at}"));
            }
            10 if n > 0 => {
                // A repeated stretch: arrays with more elements than their count says, or the reverse.
                let at = rng.below(n);
                let len = 1 + rng.below((n - at).min(64));
                let copy = body[at..at + len].to_vec();
                let times = 1 + rng.below(8);
                for _ in 0..times {
                    body.splice(at..at, copy.iter().copied());
                }
                notes.push(format!("{len} bytes at {at} repeated {times} times"));
            }
            11 => {
                // A splice: this request's head with another request's tail.
                let other = &other[4..];
                let cut = rng.below(n + 1);
                let from = rng.below(other.len() + 1);
                body.truncate(cut);
                body.extend_from_slice(&other[from..]);
                notes.push(format!("spliced at {cut} with another request from {from}"));
            }
            12 if n >= 4 => {
                // The header: a version the API does not have, or an API that does not exist.
                if rng.one_in(2) {
                    let any = rng.below(20) as i16;
                    let v = *rng.pick(&[-1i16, 13, 14, 0x7fff, i16::MIN, any]);
                    body[2..4].copy_from_slice(&v.to_be_bytes());
                    notes.push(format!("api version {v}"));
                } else {
                    let any = rng.below(80) as i16;
                    let k = *rng.pick(&[-1i16, 19, 67, 1000, 0x7fff, any]);
                    body[0..2].copy_from_slice(&k.to_be_bytes());
                    notes.push(format!("api key {k}"));
                }
            }
            13 => {
                if rng.one_in(2) {
                    size_lie = Some(lying_size(rng, n));
                    notes.push(format!("size prefix {}", size_lie.unwrap()));
                } else {
                    // Two frames in one write, the first lying about where the second starts.
                    tail = other.to_vec();
                    size_lie = Some(lying_size(rng, n));
                    notes.push(format!(
                        "size prefix {} and another frame after",
                        size_lie.unwrap()
                    ));
                }
            }
            _ => {}
        }
    }
    if notes.is_empty() {
        // Every mutated input differs from its valid original.
        let at = rng.below(body.len().max(1));
        if let Some(b) = body.get_mut(at) {
            *b ^= 0xff;
        }
        notes.push(format!("byte {at} inverted"));
    }
    let size = size_lie.unwrap_or(body.len() as i32);
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out.extend_from_slice(&tail);
    (out, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_depend_only_on_seed_and_index() {
        let a: Vec<u64> = (0..4).map(|_| Rng::for_input(7, 1234).next_u64()).collect();
        assert!(a.iter().all(|&x| x == a[0]));
        assert_ne!(
            Rng::for_input(7, 1234).next_u64(),
            Rng::for_input(7, 1235).next_u64()
        );
        assert_ne!(
            Rng::for_input(7, 1234).next_u64(),
            Rng::for_input(8, 1234).next_u64()
        );
    }
}
