//! The webhook's serving certificate, made by bootstrap: a CA of the cluster's own (ECDSA
//! P-256) and a certificate it signs for the webhook Service's names and for `localhost` /
//! `127.0.0.1` (what `kubectl port-forward` gives a laptop). The pair goes to the Secret's
//! `webhook-tls.crt` / `webhook-tls.key` (the webhook serves HTTPS from them), the CA to the
//! laptop, which trusts it (`curl --cacert`). The CA's key is not kept: a new serving
//! certificate comes with a new CA (see the README's rotation steps).

use chrono::Datelike as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The webhook Service's name (the manifests' `Service kube-system/oxide-controller-webhook`).
pub const SERVICE: &str = "oxide-controller-webhook";
/// Years a generated certificate is valid.
const VALID_YEARS: i32 = 10;

/// A generated CA and the serving pair it signed, PEM. `Debug` hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for WebhookTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookTls").finish_non_exhaustive()
    }
}

/// Certificate generation failed (the crypto library refused; nothing the person can fix).
#[derive(Debug, thiserror::Error)]
#[error("cannot generate the webhook's TLS certificate: {0}")]
pub struct TlsError(#[from] rcgen::Error);

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

fn validity(params: &mut CertificateParams) {
    let now = chrono::Utc::now();
    // From the start of last year, so a laptop clock a little behind still accepts it.
    params.not_before = rcgen::date_time_ymd(now.year() - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(now.year() + VALID_YEARS, 1, 1);
}

/// A fresh CA for `cluster` and a serving certificate for [`names`]`(namespace)`.
pub fn generate(cluster: &str, namespace: &str) -> Result<WebhookTls, TlsError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("{cluster} oxide-controller webhook CA"),
    );
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names(namespace))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("{SERVICE}.{namespace}.svc"));
    leaf.distinguished_name = dn;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut leaf);
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(WebhookTls {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pair_loads_as_the_webhook_host_serves_it_and_debug_hides_the_key() {
        let tls = generate("demo", "kube-system").unwrap();
        crate::webhook::host::tls_config(tls.cert_pem.as_bytes(), tls.key_pem.as_bytes(), "test")
            .unwrap();
        assert!(tls.ca_pem.contains("BEGIN CERTIFICATE"));
        assert_ne!(tls.ca_pem, tls.cert_pem);
        assert!(!format!("{tls:?}").contains("PRIVATE"));
        let again = generate("demo", "kube-system").unwrap();
        assert_ne!(again.key_pem, tls.key_pem, "fresh keys every time");
    }
}
