//! The twin's PKI: one self-signed CA (like k3s's `server-ca`/`client-ca`, merged), serving
//! certificates for any SANs, and client certificates whose identity (CN = user, O =
//! groups) the twin remembers by certificate DER, so authenticating a TLS peer is a map
//! lookup (the twin issued every certificate it accepts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::TwinError;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User name (`system:admin`, `system:serviceaccount:ns:name`, ...).
    pub user: String,
    /// Groups, including `system:authenticated`.
    pub groups: Vec<String>,
}

impl Identity {
    /// The k3s admin: `system:admin` in `system:masters`.
    pub fn admin() -> Self {
        Self {
            user: "system:admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    /// A ServiceAccount's identity as the token authenticator reports it.
    pub fn service_account(ns: &str, name: &str) -> Self {
        Self {
            user: format!("system:serviceaccount:{ns}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        }
    }
}

/// A client certificate and its key, PEM-encoded.
pub(crate) struct ClientCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ClientCert {
    // The private key never appears in Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCert")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// The CA plus the identities of every client certificate it issued.
pub(crate) struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    clients: Mutex<HashMap<Vec<u8>, Identity>>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

fn pki_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> TwinError {
    move |source| TwinError::Pki { what, source }
}

impl Pki {
    /// Generates a fresh CA (ECDSA P-256, like k3s).
    pub fn new() -> Result<Self, TwinError> {
        let key = KeyPair::generate().map_err(pki_err("generating the CA key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_err("CA parameters"))?;
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
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let cert = params
            .self_signed(&key)
            .map_err(pki_err("self-signing the CA"))?;
        Ok(Self {
            ca_der: cert.der().clone(),
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Issues a client certificate for `identity` (CN = user, one O per group other than
    /// `system:authenticated`) and remembers it.
    pub fn issue_client(&self, identity: &Identity) -> Result<ClientCert, TwinError> {
        let key = KeyPair::generate().map_err(pki_err("generating a client key"))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki_err("client parameters"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, identity.user.clone());
        for g in identity
            .groups
            .iter()
            .filter(|g| *g != "system:authenticated")
        {
            dn.push(DnType::OrganizationName, g.clone());
        }
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki_err("signing a client certificate"))?;
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(cert.der().to_vec(), identity.clone());
        Ok(ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Identity of a verified TLS peer's end-entity certificate.
    pub fn identify(&self, der: &[u8]) -> Option<Identity> {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(der)
            .cloned()
    }

    /// A rustls server config serving a fresh certificate for `sans`, accepting (but not
    /// requiring) client certificates signed by the CA, HTTP/1.1 only.
    pub fn server_config(&self, sans: &[String]) -> Result<Arc<rustls::ServerConfig>, TwinError> {
        let key = KeyPair::generate().map_err(pki_err("generating the serving key"))?;
        let mut all_sans: Vec<String> = sans.to_vec();
        for default in [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "localhost",
            "127.0.0.1",
        ] {
            if !all_sans.iter().any(|s| s == default) {
                all_sans.push(default.to_string());
            }
        }
        let mut params =
            CertificateParams::new(all_sans).map_err(pki_err("serving certificate SANs"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "k3s");
        dn.push(DnType::OrganizationName, "k3s");
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 1, 1);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki_err("signing the serving certificate"))?;

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.ca_der.clone())
            .map_err(|source| TwinError::Tls {
                what: "adding the CA root",
                source,
            })?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| TwinError::ClientVerifier(e.to_string()))?;
        let chain = vec![cert.der().clone(), self.ca_der.clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|source| TwinError::Tls {
                what: "protocol versions",
                source,
            })?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key_der)
            .map_err(|source| TwinError::Tls {
                what: "installing the serving certificate",
                source,
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
