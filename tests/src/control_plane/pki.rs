//! The control plane's PKI, as k3s lays it out for its own control plane: one CA that signs
//! the apiserver's serving certificate and every client certificate (CN = user, O = groups,
//! which the apiserver's x509 authenticator reads), and an ECDSA key that signs
//! ServiceAccount tokens. Everything is generated per control plane, so clusters side by
//! side do not trust each other. A restored control plane takes them from the datastore
//! instead ([`Pki::bootstrap_files`], [`Pki::from_bootstrap`]), as k3s's bootstrap data does.

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
    ca_key_pem: String,
    front_proxy_ca_key_pem: String,
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
    /// k3s's `encryption-config.json` when the cluster encrypts Secrets: an
    /// EncryptionConfiguration for `secrets` with one aescbc key named `aescbckey` and the
    /// identity fallback ([`encryption_config`]). Kept in the bootstrap data as k3s keeps it.
    pub encryption_config: Option<String>,
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

/// Valid until `end` (from an hour before now, as k3s backdates), when given.
fn until(params: &mut CertificateParams, end: Option<std::time::SystemTime>) {
    if let Some(end) = end {
        let end = time::OffsetDateTime::from(end);
        params.not_before = end.min(time::OffsetDateTime::now_utc()) - time::Duration::hours(1);
        params.not_after = end;
    }
}

/// The CA's parameters: its common name, and the usages every CA here has.
fn ca_params(cn: &str, front_proxy: bool) -> Result<CertificateParams, ControlPlaneError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = if front_proxy {
        vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ]
    } else {
        vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ]
    };
    validity(&mut params);
    Ok(params)
}

/// The names k3s gives the files of its bootstrap data that the simulator's control plane
/// has (k3s `pkg/daemons/config` `ControlRuntimeBootstrap`): one CA serves as k3s's server and
/// client CAs here, so both pairs name it. `EncryptionConfig` and `EncryptionHash` are added
/// when the cluster encrypts Secrets ([`Pki::encryption_config`]).
pub const BOOTSTRAP_FILES: [&str; 7] = [
    "ServerCA",
    "ServerCAKey",
    "ClientCA",
    "ClientCAKey",
    "ServiceKey",
    "RequestHeaderCA",
    "RequestHeaderCAKey",
];

/// k3s's `encryption-config.json` for a new aescbc `key` (`genEncryptionConfigAndState`):
/// `secrets` through aescbc with the key `aescbckey` (base64), then identity, so Secrets
/// written before encryption was on stay readable; JSON as Go's `json.Marshal` writes the
/// `apiserverconfigv1.EncryptionConfiguration`.
pub fn encryption_config(key: &[u8; 32]) -> String {
    use base64::Engine as _;
    serde_json::json!({
        "kind": "EncryptionConfiguration",
        "apiVersion": "apiserver.config.k8s.io/v1",
        "resources": [{
            "resources": ["secrets"],
            "providers": [
                {"aescbc": {"keys": [{
                    "name": "aescbckey",
                    "secret": base64::engine::general_purpose::STANDARD.encode(key),
                }]}},
                {"identity": {}},
            ],
        }],
    })
    .to_string()
}

/// k3s's `encryption-state.json` for a config it has just written: `start-` and the sha256
/// of the config in hex.
fn encryption_hash(config: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(config.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("start-{hex}")
}

impl Pki {
    /// A fresh CA (ECDSA P-256, as k3s's) and ServiceAccount key.
    pub fn new() -> Result<Self, ControlPlaneError> {
        let key = KeyPair::generate().map_err(err("generating the CA key"))?;
        let params = ca_params(
            &format!("k3s-server-ca@{}", chrono::Utc::now().timestamp()),
            false,
        )?;
        let cert = params
            .self_signed(&key)
            .map_err(err("self-signing the CA"))?;
        let sa = KeyPair::generate().map_err(err("generating the ServiceAccount key"))?;
        let fp_key = KeyPair::generate().map_err(err("generating the front-proxy CA key"))?;
        let fp = ca_params("k3s-request-header-ca", true)?;
        let fp_cert = fp
            .self_signed(&fp_key)
            .map_err(err("self-signing the front-proxy CA"))?;
        Self::assemble(
            (cert.pem(), key),
            (fp_cert.pem(), fp_key),
            sa.serialize_pem(),
        )
    }

    /// The PKI of CA `ca` (certificate PEM and key), front-proxy CA `fp` and ServiceAccount
    /// key `sa_key_pem`; the front proxy's client certificate is issued anew.
    fn assemble(
        (ca_pem, key): (String, KeyPair),
        (fp_pem, fp_key): (String, KeyPair),
        sa_key_pem: String,
    ) -> Result<Self, ControlPlaneError> {
        let bad = |what: &'static str| {
            move |_| ControlPlaneError::Pki {
                what,
                source: rcgen::Error::CouldNotParseCertificate,
            }
        };
        let ca_der = pem_der(&ca_pem)
            .ok_or(())
            .map_err(bad("the CA certificate"))?;
        let fp_der = pem_der(&fp_pem)
            .ok_or(())
            .map_err(bad("the front-proxy CA certificate"))?;
        let cn_of = |der: &[u8]| {
            subject(der)
                .and_then(|attrs| attrs.into_iter().find(|(oid, _)| *oid == OID_CN))
                .map(|(_, v)| v)
        };
        let ca_cn = cn_of(&ca_der).ok_or(()).map_err(bad("the CA's subject"))?;
        let fp_cn = cn_of(&fp_der)
            .ok_or(())
            .map_err(bad("the front-proxy CA's subject"))?;
        let sa = KeyPair::from_pem(&sa_key_pem).map_err(err("the ServiceAccount key"))?;
        let ca_key_pem = key.serialize_pem();
        let front_proxy_ca_key_pem = fp_key.serialize_pem();
        // An issuer is the CA's subject and key: certificates issued now chain to the
        // certificate that was made with them.
        let fp_issuer = Issuer::new(ca_params(&fp_cn, true)?, fp_key);
        let front_proxy_client = client_cert(&fp_issuer, "system:auth-proxy", &[], None)?;
        Ok(Self {
            ca_pem,
            ca_key_pem,
            front_proxy_ca_key_pem,
            ca_der: CertificateDer::from(ca_der),
            clients: Mutex::new(HashMap::new()),
            front_proxy_ca_pem: fp_pem,
            front_proxy_client,
            issuer: Issuer::new(ca_params(&ca_cn, false)?, key),
            service_account_pub_pem: sa.public_key_pem(),
            service_account_key_pem: sa_key_pem,
            encryption_config: None,
        })
    }

    /// What k3s keeps of this PKI in its bootstrap data (file name → PEM), which the
    /// simulator writes to the datastore when a cluster is created.
    pub fn bootstrap_files(&self) -> std::collections::BTreeMap<String, String> {
        let pems = [
            &self.ca_pem,
            &self.ca_key_pem,
            &self.ca_pem,
            &self.ca_key_pem,
            &self.service_account_key_pem,
            &self.front_proxy_ca_pem,
            &self.front_proxy_ca_key_pem,
        ];
        let mut files: std::collections::BTreeMap<String, String> = BOOTSTRAP_FILES
            .iter()
            .zip(pems)
            .map(|(name, pem)| ((*name).to_owned(), pem.clone()))
            .collect();
        if let Some(config) = &self.encryption_config {
            files.insert("EncryptionConfig".into(), config.clone());
            files.insert("EncryptionHash".into(), encryption_hash(config));
        }
        files
    }

    /// This PKI with a new EncryptionConfiguration (a random 32-byte aescbc key), as k3s's
    /// `genEncryptionConfigAndState` makes one for a server with `secrets-encryption` and no
    /// `encryption-config.json` yet.
    pub fn with_new_encryption_key(&self) -> Result<Self, ControlPlaneError> {
        use rand::RngExt as _;
        let key: [u8; 32] = rand::rng().random();
        let mut files = self.bootstrap_files();
        files.insert("EncryptionConfig".into(), encryption_config(&key));
        Self::from_bootstrap(&files)
    }

    /// The PKI a restored server writes back to disk from the bootstrap data (k3s
    /// `ReconcileBootstrapData`): the same CA, ServiceAccount key and request-header CA, so
    /// certificates and ServiceAccount tokens issued before stay valid.
    pub fn from_bootstrap(
        files: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, ControlPlaneError> {
        let get = |name: &'static str| {
            files.get(name).cloned().ok_or(ControlPlaneError::Pki {
                what: name,
                source: rcgen::Error::CouldNotParseCertificate,
            })
        };
        let key = KeyPair::from_pem(&get("ServerCAKey")?).map_err(err("ServerCAKey"))?;
        let fp_key =
            KeyPair::from_pem(&get("RequestHeaderCAKey")?).map_err(err("RequestHeaderCAKey"))?;
        let mut pki = Self::assemble(
            (get("ServerCA")?, key),
            (get("RequestHeaderCA")?, fp_key),
            get("ServiceKey")?,
        )?;
        pki.encryption_config = files.get("EncryptionConfig").cloned();
        Ok(pki)
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA's key, PEM: what kube-controller-manager signs CertificateSigningRequests with
    /// (k3s's `ClientCAKey` and `ServerCAKey`, one key here).
    pub fn ca_key_pem(&self) -> &str {
        &self.ca_key_pem
    }

    /// A serving certificate for `sans` (DNS names or IP addresses).
    pub fn serving(&self, sans: &[String]) -> Result<KeyedCert, ControlPlaneError> {
        self.serving_until(sans, None)
    }

    /// [`Self::serving`] valid until `end` (from an hour before now, as k3s backdates), or
    /// for ever when None.
    pub fn serving_until(
        &self,
        sans: &[String],
        end: Option<std::time::SystemTime>,
    ) -> Result<KeyedCert, ControlPlaneError> {
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
        until(&mut params, end);
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
        self.client_until(user, groups, None)
    }

    /// [`Self::client`] valid until `end` (a k3s node's leaf certificates, see
    /// `crate::guest::certs`), or for ever when None.
    pub fn client_until(
        &self,
        user: &str,
        groups: &[&str],
        end: Option<std::time::SystemTime>,
    ) -> Result<KeyedCert, ControlPlaneError> {
        let cert = client_cert(&self.issuer, user, groups, end)?;
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

    /// The identity of a client certificate this CA issued: known by its bytes when this
    /// PKI issued it, else read from its subject (CN user, O groups), as the apiserver's
    /// x509 authenticator does for a certificate issued before a restore. The caller has
    /// verified that it chains to this CA.
    pub fn identify(&self, der: &[u8]) -> Option<Identity> {
        let known = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(der)
            .cloned();
        known.or_else(|| {
            let attrs = subject(der)?;
            let user = attrs.iter().find(|(oid, _)| *oid == OID_CN)?.1.clone();
            let groups = attrs
                .into_iter()
                .filter(|(oid, _)| *oid == OID_O)
                .map(|(_, v)| v)
                .collect();
            Some((user, groups))
        })
    }

    /// A rustls config serving a fresh certificate for `sans`, asking for (not requiring)
    /// client certificates of this CA, HTTP/1.1 — what a k3s server's listener presents.
    pub fn server_config(
        &self,
        sans: &[String],
        end: Option<std::time::SystemTime>,
    ) -> Result<Arc<rustls::ServerConfig>, ControlPlaneError> {
        let serving = self.serving_until(sans, end)?;
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

/// The DER contents of the first PEM block of `pem`.
fn pem_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN "))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END "))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

/// The commonName and organizationName attribute types (2.5.4.3, 2.5.4.10), DER-encoded.
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// One DER element at the start of `der`: (tag, contents, rest).
fn der_element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
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

/// The subject's attributes (type OID bytes, string value) of an X.509 certificate:
/// `Certificate → tbsCertificate → [version] serial signature issuer validity subject`.
fn subject(der: &[u8]) -> Option<Vec<(&'static [u8], String)>> {
    let (_, cert, _) = der_element(der)?;
    let (_, tbs, _) = der_element(cert)?;
    let mut fields = tbs;
    let (tag, _, rest) = der_element(fields)?;
    if tag == 0xa0 {
        fields = rest;
    }
    // serial, signature algorithm, issuer, validity
    for _ in 0..4 {
        fields = der_element(fields)?.2;
    }
    let (_, mut rdns, _) = der_element(fields)?;
    let mut out = Vec::new();
    while !rdns.is_empty() {
        let (_, set, rest) = der_element(rdns)?;
        rdns = rest;
        let (_, attr, _) = der_element(set)?;
        let (_, oid, value) = der_element(attr)?;
        let (_, text, _) = der_element(value)?;
        let kind: &'static [u8] = match oid {
            o if o == OID_CN => OID_CN,
            o if o == OID_O => OID_O,
            _ => continue,
        };
        out.push((kind, String::from_utf8_lossy(text).into_owned()));
    }
    Some(out)
}

fn client_cert(
    issuer: &Issuer<'static, KeyPair>,
    user: &str,
    groups: &[&str],
    end: Option<std::time::SystemTime>,
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
    until(&mut params, end);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pki_from_its_bootstrap_files_names_and_signs_as_the_old_one() {
        let old = Pki::new().unwrap();
        let admin = old.client("system:admin", &["system:masters"]).unwrap();
        let restored = Pki::from_bootstrap(&old.bootstrap_files()).unwrap();
        assert_eq!(restored.ca_pem(), old.ca_pem());
        assert_eq!(
            restored.service_account_pub_pem,
            old.service_account_pub_pem
        );
        // A certificate the old PKI issued is named from its subject.
        assert_eq!(
            restored.identify(&admin.der),
            Some(("system:admin".to_owned(), vec!["system:masters".to_owned()]))
        );
        // New certificates chain to the same CA: the issuer field is the CA's subject.
        let fresh = restored.client("u", &[]).unwrap();
        let issuer_of = |der: &[u8]| {
            let (_, cert, _) = der_element(der).unwrap();
            let (_, tbs, _) = der_element(cert).unwrap();
            let (_, _, rest) = der_element(tbs).unwrap(); // version
            let rest = der_element(rest).unwrap().2; // serial
            let rest = der_element(rest).unwrap().2; // signature
            der_element(rest).unwrap().1.to_vec()
        };
        assert_eq!(issuer_of(&fresh.der), issuer_of(&admin.der));
        // Another PKI's files give another CA.
        let other = Pki::new().unwrap();
        assert_ne!(
            Pki::from_bootstrap(&other.bootstrap_files())
                .unwrap()
                .ca_pem(),
            old.ca_pem()
        );
    }

    #[test]
    fn the_encryption_config_travels_in_the_bootstrap_files() {
        let plain = Pki::new().unwrap();
        assert!(!plain.bootstrap_files().contains_key("EncryptionConfig"));
        let encrypting = plain.with_new_encryption_key().unwrap();
        let config = encrypting.encryption_config.clone().unwrap();
        let files = encrypting.bootstrap_files();
        assert_eq!(files["EncryptionConfig"], config);
        assert!(files["EncryptionHash"].starts_with("start-"));
        let restored = Pki::from_bootstrap(&files).unwrap();
        assert_eq!(restored.encryption_config.as_deref(), Some(config.as_str()));
        assert_eq!(restored.ca_pem(), plain.ca_pem());
        // Each key is new.
        let other = plain.with_new_encryption_key().unwrap();
        assert_ne!(other.encryption_config, encrypting.encryption_config);
    }
}
