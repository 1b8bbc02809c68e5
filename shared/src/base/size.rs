//! Byte sizes as people write them in flags and spec files (`8GiB`, `512MiB`, `20G`, or a
//! plain number of bytes), with the Oxide rules about whole GiB kept at validation time, not
//! parse time, so an error can name the field.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One GiB.
pub const GIB: u64 = 1 << 30;
/// One MiB.
pub const MIB: u64 = 1 << 20;

/// A size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// A size string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a size: write a number with a unit, like 8GiB, 512MiB or 20G")]
pub struct SizeParseError {
    input: String,
}

impl ByteSize {
    /// From whole GiB.
    pub const fn gib(n: u64) -> Self {
        ByteSize(n * GIB)
    }

    /// Bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Whole GiB if the size is a multiple of 1 GiB.
    pub fn whole_gib(self) -> Option<u64> {
        self.0.is_multiple_of(GIB).then_some(self.0 / GIB)
    }
}

impl FromStr for ByteSize {
    type Err = SizeParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SizeParseError {
            input: s.to_owned(),
        };
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| err())?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "K" | "KB" | "Ki" | "KiB" => 1 << 10,
            "M" | "MB" | "Mi" | "MiB" => MIB,
            "G" | "GB" | "Gi" | "GiB" => GIB,
            "T" | "TB" | "Ti" | "TiB" => GIB << 10,
            _ => return Err(err()),
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(err)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b != 0 && b.is_multiple_of(GIB) {
            write!(f, "{}GiB", b / GIB)
        } else if b != 0 && b.is_multiple_of(MIB) {
            write!(f, "{}MiB", b / MIB)
        } else {
            write!(f, "{b}")
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_spellings() {
        assert_eq!("8GiB".parse(), Ok(ByteSize::gib(8)));
        assert_eq!("8G".parse(), Ok(ByteSize::gib(8)));
        assert_eq!("1536MiB".parse(), Ok(ByteSize(1536 * MIB)));
        assert_eq!("4096".parse(), Ok(ByteSize(4096)));
        assert!("eight".parse::<ByteSize>().is_err());
        assert!("8 parsecs".parse::<ByteSize>().is_err());
        assert!("99999999999T".parse::<ByteSize>().is_err());
    }

    #[test]
    fn displays_the_largest_whole_unit() {
        assert_eq!(ByteSize::gib(20).to_string(), "20GiB");
        assert_eq!(ByteSize(1536 * MIB).to_string(), "1536MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
        assert_eq!(ByteSize(1536 * MIB).whole_gib(), None);
    }
}
