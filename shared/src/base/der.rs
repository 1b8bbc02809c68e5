//! Just enough DER to read a certificate's end (NotAfter) without an X.509 crate: the
//! kubeconfig's client certificate, the webhook's serving certificate.

/// The end (NotAfter) of the first certificate in `pem`, read from its DER:
/// `Certificate → tbsCertificate → [0] version, serial, signature, issuer, validity`.
pub fn certificate_end(pem: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use base64::Engine as _;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END "))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .ok()?;
    let (_, cert, _) = der_element(&der)?;
    let (_, tbs, _) = der_element(cert)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_element(rest)?.2;
    }
    // serial, signature algorithm, issuer
    for _ in 0..3 {
        rest = der_element(rest)?.2;
    }
    let (_, validity, _) = der_element(rest)?;
    let (_, _, after) = der_element(validity)?;
    let (tag, end, _) = der_element(after)?;
    let text = std::str::from_utf8(end).ok()?;
    let full = match tag {
        // UTCTime: YYMMDDHHMMSSZ, years 50-99 in the 1900s (RFC 5280 4.1.2.5.1).
        0x17 => {
            let yy: u32 = text.get(..2)?.parse().ok()?;
            format!("{}{text}", if yy >= 50 { "19" } else { "20" })
        }
        // GeneralizedTime: YYYYMMDDHHMMSSZ.
        0x18 => text.to_owned(),
        _ => return None,
    };
    chrono::NaiveDateTime::parse_from_str(full.trim_end_matches('Z'), "%Y%m%d%H%M%S")
        .ok()
        .map(|t| t.and_utc())
}

/// One DER element at the start of `der`: (tag, contents, rest).
pub fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}
