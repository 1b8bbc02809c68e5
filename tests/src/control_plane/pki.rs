//! The control plane's PKI, as k3s lays it out for its own control plane: one CA that signs
//! the apiserver's serving certificate and every client certificate (CN = user, O = groups,
//! which the apiserver's x509 authenticator reads), and an ECDSA key that signs
//! ServiceAccount tokens. Everything is generated per control plane, so clusters side by
//! side do not trust each other.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use super::ControlPlaneError;

/// A certificate and its key, PEM.
pub struct KeyedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for KeyedCert {
    // The private key never appears in Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedCert")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// One control plane's CA, able to issue serving and client certificates.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
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
        Ok(Self {
            ca_pem: cert.pem(),
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
        })
    }

    /// A client certificate for `user` in `groups` (CN and O, as the apiserver reads them).
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<KeyedCert, ControlPlaneError> {
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
            .signed_by(&key, &self.issuer)
            .map_err(err("signing a client certificate"))?;
        Ok(KeyedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
