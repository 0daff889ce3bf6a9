//! Permits log members: `[L][L random bytes][permits as u32 little-endian]`.

use rand::Rng;

/// Length of the random id this crate writes (Redisson writes 16 too).
pub const ID_LEN: usize = 16;
/// Length of a member this crate writes.
pub const MEMBER_LEN: usize = 1 + ID_LEN + 4;

/// A new member for a grant of `permits`, with 16 bytes from a generator seeded from
/// the operating system (a colliding member would overwrite an earlier grant).
pub fn new_member(permits: u32) -> [u8; MEMBER_LEN] {
    let mut member = [0u8; MEMBER_LEN];
    member[0] = ID_LEN as u8;
    rand::rng().fill_bytes(&mut member[1..=ID_LEN]);
    member[1 + ID_LEN..].copy_from_slice(&permits.to_le_bytes());
    member
}

/// The permits of a member with an id of any length, or `None` when the member does
/// not decode.
pub fn decode_permits(member: &[u8]) -> Option<u32> {
    let (&len, rest) = member.split_first()?;
    let permits = rest.get(usize::from(len)..)?;
    let bytes: [u8; 4] = permits.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let m = new_member(7);
        assert_eq!(m[0], 16);
        assert_eq!(&m[17..], &[7, 0, 0, 0]);
        assert_eq!(decode_permits(&m), Some(7));
        assert_ne!(new_member(7), m);
    }

    #[test]
    fn older_and_broken_members() {
        let eight = [8u8, 1, 2, 3, 4, 5, 6, 7, 8, 2, 1, 0, 0];
        assert_eq!(decode_permits(&eight), Some(258));
        assert_eq!(decode_permits(&[]), None);
        assert_eq!(decode_permits(&[16, 1, 2]), None);
        assert_eq!(decode_permits(b"fI1234"), None);
    }
}
