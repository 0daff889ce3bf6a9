//! A limiter's name compared with the one held, on every probe of the table.

/// Whether two limiter names are equal, as `==` answers: names of 8 to 32 bytes (the
/// usual ones) by comparing two or four 8-byte words that cover them (overlapping),
/// without a call to `memcmp`, whose set-up costs more than the comparison; others by
/// `==`.
#[inline(always)]
pub(crate) fn same_name(held: &str, name: &str) -> bool {
    let (a, b) = (held.as_bytes(), name.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    let differs = |at: usize| word(a, at) ^ word(b, at);
    match n {
        8..=16 => differs(0) | differs(n - 8) == 0,
        17..=32 => differs(0) | differs(8) | differs(n - 16) | differs(n - 8) == 0,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::same_name;

    #[test]
    fn names_are_the_same_exactly_when_equal() {
        let base: String = (0..40u8).map(|i| char::from(b'a' + i % 26)).collect();
        for len in 0..=40 {
            let name = &base[..len];
            let copy = String::from(name);
            assert!(same_name(name, &copy), "{len} bytes");
            // one byte changed, wherever it is, is another name
            for at in 0..len {
                let mut other = name.as_bytes().to_vec();
                other[at] = b'#';
                let other = String::from_utf8(other).unwrap();
                assert!(!same_name(name, &other), "{len} bytes, byte {at} changed");
                assert!(!same_name(&other, name), "{len} bytes, byte {at} changed");
            }
            // a prefix is another name
            if len > 0 {
                assert!(!same_name(name, &name[..len - 1]), "{len} bytes and one fewer");
            }
        }
        // multi-byte characters compare by bytes, as `==`
        assert!(same_name("rate_limit:é:ü:ß:€", "rate_limit:é:ü:ß:€"));
        assert!(!same_name("rate_limit:é:ü:ß:€", "rate_limit:é:ü:ß:£"));
    }
}
