//! A small deterministic generator for the random-input tests, so the macro crate
//! needs no test dependency.

pub struct XorShift(pub u64);

impl XorShift {
    /// The next number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
