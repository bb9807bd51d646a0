//! The server name (SNI) of a TLS ClientHello, read from the first bytes a
//! client sends through a tunnel, so that a tunnel opened to an allowed host
//! cannot ask a shared front end for another one.

/// What the first bytes of a tunnel say about TLS.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a TLS handshake.
    NotTls,
    /// A handshake record that does not parse as a whole ClientHello.
    Malformed,
    /// A ClientHello without a server name.
    NoName,
    Name(String),
}

/// Bytes of the first record when `start` opens a TLS handshake record
/// (header included), so the caller knows how much to read.
pub fn record_len(start: &[u8]) -> Option<usize> {
    (start.len() >= 5 && start[0] == 22 && start[1] == 3).then(|| 5 + u16::from_be_bytes([start[3], start[4]]) as usize)
}

/// Parses the first record of a TLS stream; a ClientHello that does not fit
/// in it is malformed here (and refused by the caller).
pub fn client_hello(buf: &[u8]) -> Hello {
    parse(buf).unwrap_or(Hello::Malformed)
}

fn parse(buf: &[u8]) -> Option<Hello> {
    // Record header: handshake (22), version, length.
    if buf.len() < 5 || buf[0] != 22 || buf[1] != 3 {
        return Some(Hello::NotTls);
    }
    let record_len = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    let record = buf.get(5..5 + record_len)?;
    // Handshake header: ClientHello (1), 24-bit length.
    if record.first() != Some(&1) {
        return Some(Hello::NotTls);
    }
    let mut r = Reader(record.get(4..)?);
    r.skip(2 + 32)?; // version, random
    let session = r.u8()? as usize;
    r.skip(session)?;
    let suites = r.u16()? as usize;
    r.skip(suites)?;
    let compression = r.u8()? as usize;
    r.skip(compression)?;
    if r.0.is_empty() {
        return Some(Hello::NoName);
    }
    let ext_len = r.u16()? as usize;
    let mut exts = Reader(r.take(ext_len.min(r.0.len()))?);
    while exts.0.len() >= 4 {
        let kind = exts.u16()?;
        let len = exts.u16()? as usize;
        let body = exts.take(len)?;
        if kind == 0 {
            let mut list = Reader(body);
            let _list_len = list.u16()?;
            while !list.0.is_empty() {
                let name_type = list.u8()?;
                let name_len = list.u16()? as usize;
                let name = list.take(name_len)?;
                if name_type == 0 {
                    return Some(Hello::Name(String::from_utf8_lossy(name).to_ascii_lowercase()));
                }
            }
        }
    }
    Some(Hello::NoName)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello naming `host`.
    fn hello(host: &str) -> Vec<u8> {
        let name = host.as_bytes();
        let mut sni = vec![];
        sni.extend(((name.len() + 3) as u16).to_be_bytes());
        sni.push(0);
        sni.extend((name.len() as u16).to_be_bytes());
        sni.extend(name);
        let mut ext = vec![0, 0];
        ext.extend((sni.len() as u16).to_be_bytes());
        ext.extend(sni);
        let mut body = vec![3, 3];
        body.extend([0u8; 32]);
        body.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut hs = vec![1, 0];
        hs.extend((body.len() as u16).to_be_bytes());
        hs.extend(body);
        let mut rec = vec![22, 3, 1];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[test]
    fn reads_the_server_name() {
        assert_eq!(client_hello(&hello("PyPI.org")), Hello::Name("pypi.org".into()));
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        let h = hello("pypi.org");
        assert_eq!(client_hello(&h[..20]), Hello::Malformed, "a truncated hello is refused");
        assert_eq!(record_len(&h), Some(h.len()));
    }
}
