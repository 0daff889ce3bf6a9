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

/// Writes the call's `tag` (below 2^20) into the low twenty bits of `member`'s first
/// three id bytes, which acquire.lua reads and its reply carries; the id keeps 108
/// random bits.
pub fn tag(member: &mut [u8; MEMBER_LEN], tag: u64) {
    member[1] = (member[1] & !15) | ((tag >> 16) & 15) as u8;
    member[2] = (tag >> 8) as u8;
    member[3] = tag as u8;
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

    /// The tag is the low twenty bits of the first three id bytes, as
    /// acquire_plain.lua reads them (`high % 16 * 65536 + mid * 256 + low`); the
    /// member still decodes.
    #[test]
    fn a_tag_in_the_first_id_bytes() {
        for tag in [0, 1, 255, 256, 700, 65_536, 1_048_575] {
            let mut m = new_member(7);
            let random = m[1] & !15;
            super::tag(&mut m, tag);
            let read = u64::from(m[1] % 16) * 65_536 + u64::from(m[2]) * 256 + u64::from(m[3]);
            assert_eq!(read, tag);
            assert_eq!(m[1] & !15, random, "the other bits kept");
            assert_eq!(decode_permits(&m), Some(7));
        }
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
