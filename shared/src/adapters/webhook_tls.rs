//! The webhook's serving certificate: a CA of the cluster's own (ECDSA P-256, ten years, name
//! constraints limiting it to the webhook's names) and a one-year certificate it signs for
//! the webhook Service's names and for `localhost` / `127.0.0.1` (what `kubectl
//! port-forward` gives a laptop).
//!
//! Where they live (issue 46, audit security-2 N10):
//! - the serving pair and the CA's certificate: Secret
//!   `kube-system/oxide-controller-webhook-tls` (`tls.crt`, `tls.key`, `ca.crt`), which the
//!   webhook's pod mounts and re-reads (see [`crate::webhook::host::ReloadingCert`]);
//! - the CA's key: Secret `kube-system/oxide-controller-webhook-ca`, mounted by no pod and
//!   read only by the reconcile, which re-issues the serving pair inside
//!   `certificates.renew_before_days` of its end ([`reissue`]);
//! - the CA's certificate also beside the laptop's resume file, which `curl --cacert` and
//!   `scale` trust: a re-issued pair needs nothing new on the laptop.

use chrono::Datelike as _;
use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    NameConstraints,
};

/// The webhook Service's name (the manifests' `Service kube-system/oxide-controller-webhook`).
pub const SERVICE: &str = "oxide-controller-webhook";
pub use crate::base::secrets::webhook::{CA_SECRET, TLS_SECRET, WebhookCa, WebhookTls, keys};
/// Years the CA is valid.
const CA_YEARS: i32 = 10;
/// Days a serving certificate is valid (re-issued by the reconcile well before).
pub const LEAF_DAYS: i64 = 365;

/// Certificate generation failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The crypto library refused (nothing the person can fix).
    #[error("cannot generate the webhook's TLS certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A re-issued certificate does not verify under the stored CA (the CA Secret holds a key
    /// of another CA, or a CA of another cluster or namespace).
    #[error(
        "a certificate signed with the key in Secret {CA_SECRET} does not verify under its ca.crt ({0}); the Secret was changed by hand: restore it or re-run bootstrap after deleting both webhook Secrets"
    )]
    Mismatch(String),
}

/// The names the serving certificate holds: the Service in `namespace` as Kubernetes DNS
/// spells it, and the loopback names a port-forward uses.
pub fn names(namespace: &str) -> Vec<String> {
    vec![
        SERVICE.to_owned(),
        format!("{SERVICE}.{namespace}"),
        format!("{SERVICE}.{namespace}.svc"),
        format!("{SERVICE}.{namespace}.svc.cluster.local"),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ]
}

/// The CA's parameters, the same every time for `cluster` and `namespace`: [`reissue`]
/// signs with them (the issuer name of what it signs is this subject).
fn ca_params(
    cluster: &str,
    namespace: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<CertificateParams, TlsError> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{cluster} oxide-controller webhook CA"),
    );
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    // A key that leaks signs for the webhook's names and nothing else (RFC 5280 4.2.1.10).
    let mut permitted: Vec<GeneralSubtree> = names(namespace)
        .into_iter()
        .filter(|n| n.parse::<std::net::IpAddr>().is_err())
        .map(GeneralSubtree::DnsName)
        .collect();
    permitted.push(GeneralSubtree::IpAddress(CidrSubnet::V4(
        [127, 0, 0, 1],
        [255, 255, 255, 255],
    )));
    ca.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted,
        excluded_subtrees: Vec::new(),
    });
    // From the start of last year, so a laptop clock a little behind still accepts it.
    ca.not_before = rcgen::date_time_ymd(now.year() - 1, 1, 1);
    ca.not_after = rcgen::date_time_ymd(now.year() + CA_YEARS, 1, 1);
    Ok(ca)
}

fn to_offset(t: chrono::DateTime<chrono::Utc>) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// A serving certificate for [`names`]`(namespace)` valid from an hour before `now` (a clock
/// a little behind still accepts it) for [`LEAF_DAYS`], signed by `issuer`.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    namespace: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names(namespace))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{SERVICE}.{namespace}.svc"));
    leaf.distinguished_name = dn;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = to_offset(now - chrono::Duration::hours(1));
    leaf.not_after = to_offset(now + chrono::Duration::days(LEAF_DAYS));
    let cert = leaf.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A fresh CA for `cluster` and a serving certificate for [`names`]`(namespace)`.
pub fn generate(cluster: &str, namespace: &str) -> Result<(WebhookTls, WebhookCa), TlsError> {
    let now = chrono::Utc::now();
    let ca_key = KeyPair::generate()?;
    let params = ca_params(cluster, namespace, now)?;
    let ca_cert = params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(params, ca_key);
    let (cert_pem, key_pem) = leaf(&issuer, namespace, now)?;
    let ca = WebhookCa {
        ca_pem: ca_cert.pem(),
        ca_key_pem,
    };
    let tls = WebhookTls {
        ca_pem: ca.ca_pem.clone(),
        cert_pem,
        key_pem,
    };
    verify(&tls, namespace, now)?;
    Ok((tls, ca))
}

/// A new serving pair from the kept CA, valid [`LEAF_DAYS`] from `now`; checked to verify
/// under the CA's certificate for every name before it is handed back.
pub fn reissue(
    ca: &WebhookCa,
    cluster: &str,
    namespace: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<WebhookTls, TlsError> {
    let ca_key = KeyPair::from_pem(&ca.ca_key_pem)?;
    let issuer = Issuer::new(ca_params(cluster, namespace, now)?, ca_key);
    let (cert_pem, key_pem) = leaf(&issuer, namespace, now)?;
    let tls = WebhookTls {
        ca_pem: ca.ca_pem.clone(),
        cert_pem,
        key_pem,
    };
    verify(&tls, namespace, now)?;
    Ok(tls)
}

/// `tls.cert_pem` verifies under `tls.ca_pem` as a TLS client checks it (rustls's webpki,
/// name constraints included) for each of [`names`] at `now`.
pub fn verify(
    tls: &WebhookTls,
    namespace: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), TlsError> {
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    let bad = |e: &dyn std::fmt::Display| TlsError::Mismatch(e.to_string());
    let ca = CertificateDer::from_pem_slice(tls.ca_pem.as_bytes()).map_err(|e| bad(&e))?;
    let cert = CertificateDer::from_pem_slice(tls.cert_pem.as_bytes()).map_err(|e| bad(&e))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).map_err(|e| bad(&e))?;
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .map_err(|e| bad(&e))?;
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(now.timestamp()).unwrap_or(0),
    ));
    for name in names(namespace) {
        let server = ServerName::try_from(name.clone()).map_err(|e| bad(&e))?;
        verifier
            .verify_server_cert(&cert, &[], &server, &[], at)
            .map_err(|e| bad(&format!("{name}: {e}")))?;
    }
    Ok(())
}

/// The end (NotAfter) of the serving certificate in `cert_pem`.
pub fn end(cert_pem: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    crate::base::der::certificate_end(cert_pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pair_loads_as_the_webhook_host_serves_it_and_debug_hides_the_key() {
        let (tls, ca) = generate("demo", "kube-system").unwrap();
        crate::webhook::host::tls_config(tls.cert_pem.as_bytes(), tls.key_pem.as_bytes(), "test")
            .unwrap();
        assert!(tls.ca_pem.contains("BEGIN CERTIFICATE"));
        assert_eq!(tls.ca_pem, ca.ca_pem);
        assert_ne!(tls.ca_pem, tls.cert_pem);
        assert!(!format!("{tls:?}{ca:?}").contains("PRIVATE"));
        let (again, _) = generate("demo", "kube-system").unwrap();
        assert_ne!(again.key_pem, tls.key_pem, "fresh keys every time");
    }

    #[test]
    fn the_serving_certificate_lasts_a_year_and_a_reissue_verifies_under_the_same_ca() {
        let now = chrono::Utc::now();
        let (tls, ca) = generate("demo", "kube-system").unwrap();
        let first = end(&tls.cert_pem).unwrap();
        assert!(
            (first - (now + chrono::Duration::days(LEAF_DAYS)))
                .num_seconds()
                .abs()
                < 60
        );
        let later = now + chrono::Duration::days(330);
        let again = reissue(&ca, "demo", "kube-system", later).unwrap();
        assert_eq!(again.ca_pem, tls.ca_pem);
        assert_ne!(again.key_pem, tls.key_pem);
        assert!(end(&again.cert_pem).unwrap() > first + chrono::Duration::days(300));
        verify(&again, "kube-system", later).unwrap();
        // After its end the first no longer verifies; the re-issued one still does.
        let past = first + chrono::Duration::days(1);
        assert!(verify(&tls, "kube-system", past).is_err());
        verify(&again, "kube-system", past).unwrap();
    }

    #[test]
    fn a_ca_key_of_another_ca_is_refused_before_anything_is_written() {
        let (_, ca) = generate("demo", "kube-system").unwrap();
        let (_, other) = generate("demo", "kube-system").unwrap();
        let mixed = WebhookCa {
            ca_pem: ca.ca_pem,
            ca_key_pem: other.ca_key_pem,
        };
        let err = reissue(&mixed, "demo", "kube-system", chrono::Utc::now()).unwrap_err();
        assert!(matches!(err, TlsError::Mismatch(_)), "{err}");
        assert!(!err.to_string().contains("PRIVATE"));
    }

    #[test]
    fn the_ca_signs_for_the_webhooks_names_only() {
        // A leaked CA key cannot mint a certificate a client accepts for another name: the
        // CA's name constraints are enforced by the verifier.
        let now = chrono::Utc::now();
        let (_, ca) = generate("demo", "kube-system").unwrap();
        let key = KeyPair::from_pem(&ca.ca_key_pem).unwrap();
        let issuer = Issuer::new(ca_params("demo", "kube-system", now).unwrap(), key);
        let leaf_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["kubernetes.default.svc".to_owned()]).unwrap();
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let forged = p.signed_by(&leaf_key, &issuer).unwrap();
        use rustls::client::danger::ServerCertVerifier as _;
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from_pem_slice(ca.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let v = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .unwrap();
        let r = v.verify_server_cert(
            forged.der(),
            &[],
            &rustls::pki_types::ServerName::try_from("kubernetes.default.svc").unwrap(),
            &[],
            rustls::pki_types::UnixTime::now(),
        );
        assert!(r.is_err(), "a certificate for another name verified: {r:?}");
    }
}
