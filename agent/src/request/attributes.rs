//! A request's attributes as the classification reads them: the bytes the
//! host hands over, and the one rule that turns them into text.
//!
//! Envoy passes header values on as bytes, and HTTP allows any byte above
//! 0x7f in one (obs-text): `x-tenant: \xff` reaches the filter. A value
//! that is not valid UTF-8 is treated as absent. The key part's configured
//! default applies (for the priority header: the route's class, else the
//! default class), so bytes like these can neither trap the filter nor mint
//! cells or tenants of their own, and every such value read is counted
//! (`sluice.header_values_invalid`, [`crate::metrics::Counter`]). Both data
//! planes read through here: the proxy-wasm binding and the native module
//! only fetch bytes. Checking UTF-8 is the work decoding a value into text
//! did before, so the rule adds nothing to the request path.

use std::borrow::Cow;

/// The request attributes a cell can be built from, as the host holds
/// them: raw bytes, borrowed from the host (the native module) or copied
/// out of it (a proxy-wasm host call returns a copy).
pub trait RequestAttributes {
    /// A request header's value by lower-case name, pseudo-headers such as
    /// `:authority` and `:path` included.
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>>;
    /// The name of the route the request matched.
    fn route_name(&self) -> Option<Cow<'_, [u8]>>;
}

/// What one attribute read from the host is, by the rule above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute<'a> {
    /// The host has no such attribute.
    Absent,
    /// The host's bytes are not UTF-8: as if absent, and counted.
    Invalid,
    /// The attribute's value.
    Text(Cow<'a, str>),
}

impl<'a> Attribute<'a> {
    /// What the host's bytes mean. A valid value is not copied.
    pub fn from_host(bytes: Option<Cow<'a, [u8]>>) -> Self {
        match bytes {
            None => Self::Absent,
            Some(Cow::Borrowed(bytes)) => match std::str::from_utf8(bytes) {
                Ok(text) => Self::Text(Cow::Borrowed(text)),
                Err(_) => Self::Invalid,
            },
            Some(Cow::Owned(bytes)) => match String::from_utf8(bytes) {
                Ok(text) => Self::Text(Cow::Owned(text)),
                Err(_) => Self::Invalid,
            },
        }
    }
}

/// Reads a request's attributes as text by the rule above, counting the
/// values it had to treat as absent.
#[derive(Debug)]
pub struct AttributeReader<'r, R: RequestAttributes + ?Sized> {
    request: &'r R,
    invalid: u32,
}

impl<'r, R: RequestAttributes + ?Sized> AttributeReader<'r, R> {
    /// A reader of `request` that has read nothing yet.
    pub fn new(request: &'r R) -> Self {
        Self {
            request,
            invalid: 0,
        }
    }

    /// A header's value; `None` when absent or not UTF-8.
    pub fn header(&mut self, name: &str) -> Option<Cow<'r, str>> {
        let bytes = self.request.header(name);
        self.text(bytes)
    }

    /// The matched route's name; `None` when absent or not UTF-8 (Envoy's
    /// configuration cannot name a route so, but the rule is the same).
    pub fn route_name(&mut self) -> Option<Cow<'r, str>> {
        let bytes = self.request.route_name();
        self.text(bytes)
    }

    /// How many of the values read were not UTF-8.
    pub fn invalid(&self) -> u32 {
        self.invalid
    }

    fn text(&mut self, bytes: Option<Cow<'r, [u8]>>) -> Option<Cow<'r, str>> {
        match Attribute::from_host(bytes) {
            Attribute::Text(text) => Some(text),
            Attribute::Absent => None,
            Attribute::Invalid => {
                self.invalid = self.invalid.saturating_add(1);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn valid_bytes_are_the_value_without_a_copy() {
        let borrowed = Attribute::from_host(Some(Cow::Borrowed(b"acme".as_slice())));
        assert!(matches!(borrowed, Attribute::Text(Cow::Borrowed("acme"))));
        let owned = Attribute::from_host(Some(Cow::Owned("é".as_bytes().to_vec())));
        assert!(matches!(&owned, Attribute::Text(Cow::Owned(text)) if text == "é"));
        assert_eq!(
            Attribute::from_host(Some(Cow::Borrowed(b"".as_slice()))),
            Attribute::Text(Cow::Borrowed(""))
        );
        assert_eq!(Attribute::from_host(None), Attribute::Absent);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_invalid() {
        // A lone byte above 0x7f, a cut two-byte sequence, an overlong
        // encoding of '/', a surrogate, and a valid prefix before a bad byte.
        let samples: [&[u8]; 5] = [
            b"\xff",
            b"ab\xc3",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            b"acme\x80",
        ];
        for bytes in samples {
            assert_eq!(
                Attribute::from_host(Some(Cow::Borrowed(bytes))),
                Attribute::Invalid,
                "{bytes:?}"
            );
            assert_eq!(
                Attribute::from_host(Some(Cow::Owned(bytes.to_vec()))),
                Attribute::Invalid,
                "{bytes:?}"
            );
        }
    }

    struct Bytes;

    impl RequestAttributes for Bytes {
        fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
            match name {
                "good" => Some(Cow::Borrowed(b"value".as_slice())),
                "bad" => Some(Cow::Borrowed(b"\xfe\xff".as_slice())),
                _ => None,
            }
        }

        fn route_name(&self) -> Option<Cow<'_, [u8]>> {
            Some(Cow::Owned(vec![b'r', 0xff]))
        }
    }

    #[test]
    fn the_reader_counts_only_invalid_values() {
        let mut reader = AttributeReader::new(&Bytes);
        assert_eq!(reader.header("good").as_deref(), Some("value"));
        assert_eq!(reader.header("absent"), None);
        assert_eq!(reader.invalid(), 0);
        assert_eq!(reader.header("bad"), None);
        assert_eq!(reader.route_name(), None);
        assert_eq!(reader.invalid(), 2);
    }
}
