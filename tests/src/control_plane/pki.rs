//! The control plane's PKI, as k3s lays it out for its own control plane: one CA that signs
//! the apiserver's serving certificate and every client certificate (CN = user, O = groups,
//! which the apiserver's x509 authenticator reads), and an ECDSA key that signs
//! ServiceAccount tokens. Everything is generated per control plane, so clusters side by
//! side do not trust each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::ControlPlaneError;

/// A certificate and its key, PEM.
pub struct KeyedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
    pub key_der: Vec<u8>,
}

impl std::fmt::Debug for KeyedCert {
    // The private key never appears in Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedCert")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Who a client certificate names: user (CN) and groups (O).
pub type Identity = (String, Vec<String>);

/// One control plane's CA, able to issue serving and client certificates, and the separate
/// front-proxy CA whose client the apiserver trusts to name the user in `X-Remote-User`
/// (`--requestheader-client-ca-file`), as an aggregation front proxy is trusted.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    /// Every client certificate issued (DER → identity), so the front proxy can name the
    /// caller of a verified TLS peer without parsing X.509.
    clients: Mutex<HashMap<Vec<u8>, Identity>>,
    /// The front-proxy CA (PEM) and the proxy's client certificate under it.
    pub front_proxy_ca_pem: String,
    pub front_proxy_client: KeyedCert,
    /// The ServiceAccount token signing key (PKCS#8 PEM).
    pub service_account_key_pem: String,
    /// Its public half (what `--service-account-key-file` verifies with).
    pub service_account_pub_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn err(what: &'static str) -> impl FnOnce(rcgen::Error) -> ControlPlaneError {
    move |source| ControlPlaneError::Pki { what, source }
}

fn validity(params: &mut CertificateParams) {
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
}

impl Pki {
    /// A fresh CA (ECDSA P-256, as k3s's) and ServiceAccount key.
    pub fn new() -> Result<Self, ControlPlaneError> {
        let key = KeyPair::generate().map_err(err("generating the CA key"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("k3s-server-ca@{}", chrono::Utc::now().timestamp()),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params);
        let cert = params
            .self_signed(&key)
            .map_err(err("self-signing the CA"))?;
        let sa = KeyPair::generate().map_err(err("generating the ServiceAccount key"))?;

        let fp_key = KeyPair::generate().map_err(err("generating the front-proxy CA key"))?;
        let mut fp = CertificateParams::new(Vec::<String>::new()).map_err(err("front-proxy CA"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "k3s-request-header-ca");
        fp.distinguished_name = dn;
        fp.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        fp.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut fp);
        let fp_cert = fp
            .self_signed(&fp_key)
            .map_err(err("self-signing the front-proxy CA"))?;
        let fp_issuer = Issuer::new(fp, fp_key);
        let front_proxy_client = client_cert(&fp_issuer, "system:auth-proxy", &[])?;

        Ok(Self {
            ca_pem: cert.pem(),
            ca_der: cert.der().clone(),
            clients: Mutex::new(HashMap::new()),
            front_proxy_ca_pem: fp_cert.pem(),
            front_proxy_client,
            issuer: Issuer::new(params, key),
            service_account_key_pem: sa.serialize_pem(),
            service_account_pub_pem: sa.public_key_pem(),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A serving certificate for `sans` (DNS names or IP addresses).
    pub fn serving(&self, sans: &[String]) -> Result<KeyedCert, ControlPlaneError> {
        let key = KeyPair::generate().map_err(err("generating a serving key"))?;
        let mut params = CertificateParams::new(sans.to_vec()).map_err(err("serving SANs"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kube-apiserver");
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err("signing a serving certificate"))?;
        Ok(KeyedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        })
    }

    /// A client certificate for `user` in `groups` (CN and O, as the apiserver reads them).
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<KeyedCert, ControlPlaneError> {
        let cert = client_cert(&self.issuer, user, groups)?;
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                cert.der.clone(),
                (
                    user.to_string(),
                    groups.iter().map(|g| g.to_string()).collect(),
                ),
            );
        Ok(cert)
    }

    /// The identity of a client certificate this CA issued.
    pub fn identify(&self, der: &[u8]) -> Option<Identity> {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(der)
            .cloned()
    }

    /// A rustls config serving a fresh certificate for `sans`, asking for (not requiring)
    /// client certificates of this CA, HTTP/1.1 — what a k3s server's listener presents.
    pub fn server_config(
        &self,
        sans: &[String],
    ) -> Result<Arc<rustls::ServerConfig>, ControlPlaneError> {
        let serving = self.serving(sans)?;
        let tls = |what: &'static str| {
            move |e: rustls::Error| ControlPlaneError::Tls(format!("{what}: {e}"))
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone()).map_err(tls("the CA root"))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| ControlPlaneError::Tls(format!("client verifier: {e}")))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving.key_der.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls("protocol versions"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![
                    CertificateDer::from(serving.der.clone()),
                    self.ca_der.clone(),
                ],
                key,
            )
            .map_err(tls("the serving certificate"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn client_cert(
    issuer: &Issuer<'static, KeyPair>,
    user: &str,
    groups: &[&str],
) -> Result<KeyedCert, ControlPlaneError> {
    let key = KeyPair::generate().map_err(err("generating a client key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("client"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, user);
    for g in groups {
        dn.push(DnType::OrganizationName, *g);
    }
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params);
    let cert = params
        .signed_by(&key, issuer)
        .map_err(err("signing a client certificate"))?;
    Ok(KeyedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    })
}
