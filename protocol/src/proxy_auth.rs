//! The HTTP proxy's credentials: the value of a `Proxy-Authorization`
//! header in the Basic scheme (RFC 7617), `Basic base64(user:password)`,
//! decoded without I/O. Anything else (another scheme, bytes a header
//! value may not hold, base64 that does not decode, no colon) is no
//! credentials: the proxy answers 407 either way, so one `None` serves.

use base64::Engine as _;

/// A decoded `user:password`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicCredentials {
    decoded: Vec<u8>,
    colon: usize,
}

impl BasicCredentials {
    /// The user name: everything before the first colon (RFC 7617 §2: a
    /// user name cannot contain one).
    pub fn user(&self) -> &[u8] {
        &self.decoded[..self.colon]
    }

    /// The password: everything after the first colon (it may hold more).
    pub fn password(&self) -> &[u8] {
        &self.decoded[self.colon + 1..]
    }
}

/// The credentials in `value`, a `Proxy-Authorization` header's bytes: the
/// scheme `Basic` in any case, spaces, and standard base64 of
/// `user:password`. What it decodes is never longer than `value`.
pub fn parse_basic(value: &[u8]) -> Option<BasicCredentials> {
    // What a header value may hold as text (hyper's `HeaderValue::to_str`).
    if !value
        .iter()
        .all(|&byte| byte == b'\t' || (0x20..0x7f).contains(&byte))
    {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let (scheme, encoded) = text.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|&byte| byte == b':')?;
    Some(BasicCredentials { decoded, colon })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(text: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(text)
        )
    }

    #[test]
    fn a_basic_header_gives_the_user_and_the_password() {
        let credentials = parse_basic(basic("alice:s3:cret").as_bytes()).expect("credentials");
        assert_eq!(credentials.user(), b"alice");
        assert_eq!(credentials.password(), b"s3:cret");
        // Any case of the scheme, spaces around.
        let value = format!("  bAsIc   {}  ", &basic("bob:pw")[6..]);
        let credentials = parse_basic(value.as_bytes()).expect("credentials");
        assert_eq!(
            (credentials.user(), credentials.password()),
            (&b"bob"[..], &b"pw"[..])
        );
        // An empty password is a password.
        assert_eq!(
            parse_basic(basic("carol:").as_bytes()).map(|c| c.password().len()),
            Some(0)
        );
    }

    #[test]
    fn anything_else_is_no_credentials() {
        for value in [
            "".to_owned(),
            "Basic".to_owned(),
            "Basic ".to_owned(),
            "Bearer abc".to_owned(),
            basic("no-colon"),
            "Basic !!!not-base64".to_owned(),
            format!("Digest {}", &basic("a:b")[6..]),
        ] {
            assert_eq!(parse_basic(value.as_bytes()), None, "{value:?}");
        }
        // Bytes a header value cannot hold as text.
        let mut value = basic("a:b").into_bytes();
        value.push(0x80);
        assert_eq!(parse_basic(&value), None);
        value.pop();
        value.insert(3, b'\n');
        assert_eq!(parse_basic(&value), None);
    }
}
