//! A client certificate from the cluster itself (issue 46 item 2): a fresh ECDSA P-256 key, a
//! PKCS#10 request, and the `certificates.k8s.io/v1` CertificateSigningRequest round trip for
//! the signer `kubernetes.io/kube-apiserver-client` — create, approve (the `approval`
//! subresource), wait for kube-controller-manager's `status.certificate`, delete. Which way
//! to renew and the identity asked for are [`crate::domain::operator_credential`]'s; writing
//! the kubeconfig is [`crate::adapters::kubeconfig`]'s. Errors never quote the key.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::adapters::kubeclient::{api_message, api_status};
use crate::domain::operator_credential as op;

/// The field manager of what this module writes.
const FIELD_MANAGER: &str = "oxide-controller-bootstrap-kubeconfig";

/// How often the request is looked at while the signer has not answered.
const POLL: Duration = Duration::from_millis(500);

/// Trouble on the CSR way.
#[derive(Debug, thiserror::Error)]
pub enum ClientCsrError {
    #[error("cannot build the certificate signing request")]
    Build(#[source] rcgen::Error),
    #[error("cannot build a client from the kubeconfig; run bootstrap kubeconfig --via ssh")]
    Client(#[source] crate::adapters::kubeclient::KubeClientError),
    #[error(
        "the API refused the kubeconfig's credential as unauthorized (401); run bootstrap kubeconfig --via ssh"
    )]
    Unauthorized,
    #[error(
        "{step}: the API answered {}: {message}; the kubeconfig's credential must be the cluster's administrator (k3s.yaml's, or one bound to cluster-admin), else run bootstrap kubeconfig --via ssh",
        code.map_or_else(|| "nothing".to_owned(), |c| c.to_string())
    )]
    Api {
        step: &'static str,
        code: Option<u16>,
        message: String,
    },
    #[error(
        "CertificateSigningRequest {name} was not signed: {reason}; run bootstrap kubeconfig --via ssh"
    )]
    NotIssued { name: String, reason: String },
    #[error(
        "CertificateSigningRequest {name} had no certificate after {} s: kube-controller-manager signs {} only with --cluster-signing-kube-apiserver-client-cert-file/-key-file (k3s passes them); run bootstrap kubeconfig --via ssh",
        waited.as_secs(), op::SIGNER
    )]
    Timeout { name: String, waited: Duration },
}

impl ClientCsrError {
    fn api(step: &'static str, e: &kube::Error) -> Self {
        match api_status(e) {
            Some(401) => Self::Unauthorized,
            code => Self::Api {
                step,
                code,
                message: api_message(e),
            },
        }
    }
}

/// A new key and the request for it, both PEM.
pub struct ClientRequest {
    pub csr_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for ClientRequest {
    // The private key never appears in Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientRequest")
            .field("csr_pem", &self.csr_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A fresh ECDSA P-256 key and a request naming `user` (CN) and, when given, `group` (O) —
/// the product asks for none ([`op::operator_user`]; `system:masters` is refused, see the
/// domain module).
pub fn new_request(user: &str, group: Option<&str>) -> Result<ClientRequest, ClientCsrError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(ClientCsrError::Build)?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(ClientCsrError::Build)?;
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, user);
    if let Some(group) = group {
        dn.push(rcgen::DnType::OrganizationName, group);
    }
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&key)
        .map_err(ClientCsrError::Build)?;
    Ok(ClientRequest {
        csr_pem: csr.pem().map_err(ClientCsrError::Build)?,
        key_pem: key.serialize_pem(),
    })
}

/// The whole CSR way through context `context` of `kubeconfig`, with the credential it
/// holds: [`ensure_operator_binding`] for `user`, then [`sign`]. The certificate, PEM.
pub async fn renew(
    kubeconfig: &std::path::Path,
    context: &str,
    user: &str,
    name: &str,
    request: &ClientRequest,
    wait: Duration,
) -> Result<String, ClientCsrError> {
    let client = crate::adapters::kubeclient::client(Some(kubeconfig), Some(context))
        .await
        .map_err(ClientCsrError::Client)?;
    ensure_operator_binding(&client, user).await?;
    sign(&client, name, request, wait).await
}

/// The ClusterRoleBinding giving `user` `cluster-admin` (server-side apply: idempotent).
pub async fn ensure_operator_binding(
    client: &kube::Client,
    user: &str,
) -> Result<(), ClientCsrError> {
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": op::OPERATOR_BINDING,
            "labels": {"app.kubernetes.io/managed-by": "oxide-controller"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": op::OPERATOR_ROLE,
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    });
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            op::OPERATOR_BINDING,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await
        .map(drop)
        .map_err(|e| ClientCsrError::api("ensure-binding", &e))
}

/// Creates CertificateSigningRequest `name` for `req`, approves it, waits up to `wait` for
/// its certificate, and deletes it whatever happened. The certificate, PEM.
pub async fn sign(
    client: &kube::Client,
    name: &str,
    req: &ClientRequest,
    wait: Duration,
) -> Result<String, ClientCsrError> {
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "oxide-controller".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(req.csr_pem.as_bytes().to_vec()),
            signer_name: op::SIGNER.to_owned(),
            expiration_seconds: Some(op::EXPIRATION_SECONDS),
            usages: Some(op::USAGES.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        status: None,
    };
    api.create(&PostParams::default(), &csr)
        .await
        .map_err(|e| ClientCsrError::api("create-csr", &e))?;
    info!(
        csr = name,
        signer = op::SIGNER,
        "certificate signing request created"
    );
    let signed = approve_and_wait(&api, name, wait).await;
    if let Err(e) = api.delete(name, &DeleteParams::default()).await {
        warn!(csr = name, error = %api_message(&e), "cannot delete the certificate signing request; kube-controller-manager's csrcleaner removes it within the hour");
    } else {
        info!(csr = name, "certificate signing request deleted");
    }
    signed
}

/// Steps `approve` and `wait-certificate` of [`sign`].
async fn approve_and_wait(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    wait: Duration,
) -> Result<String, ClientCsrError> {
    let approval = serde_json::json!({"status": {"conditions": [{
        "type": "Approved",
        "status": "True",
        "reason": "OxideControllerOperatorRenewal",
        "message": "bootstrap kubeconfig renews the operator's client certificate",
    }]}});
    api.patch_approval(name, &PatchParams::default(), &Patch::Merge(&approval))
        .await
        .map_err(|e| ClientCsrError::api("approve-csr", &e))?;
    let started = Instant::now();
    loop {
        let csr = api
            .get(name)
            .await
            .map_err(|e| ClientCsrError::api("wait-certificate", &e))?;
        let status = csr.status.unwrap_or_default();
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            return String::from_utf8(cert.0).map_err(|_| ClientCsrError::NotIssued {
                name: name.to_owned(),
                reason: "status.certificate is not PEM text".to_owned(),
            });
        }
        if let Some(c) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            return Err(ClientCsrError::NotIssued {
                name: name.to_owned(),
                reason: format!(
                    "{} ({}: {})",
                    c.type_,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default()
                ),
            });
        }
        if started.elapsed() >= wait {
            return Err(ClientCsrError::Timeout {
                name: name.to_owned(),
                waited: wait,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The subject of a PKCS#10 request: (attribute OID bytes, value) in order.
    fn csr_subject(pem: &str) -> Vec<(Vec<u8>, String)> {
        use base64::Engine as _;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap();
        fn el(d: &[u8]) -> (u8, &[u8], &[u8]) {
            crate::base::der::der_element(d).unwrap()
        }
        // CertificationRequest → CertificationRequestInfo → version, subject
        let (_, req, _) = el(&der);
        let (_, info, _) = el(req);
        let (_, _, rest) = el(info);
        let (tag, mut rdns, _) = el(rest);
        assert_eq!(tag, 0x30, "subject is a SEQUENCE");
        let mut out = Vec::new();
        while !rdns.is_empty() {
            let (_, set, next) = el(rdns);
            let (_, atv, _) = el(set);
            let (_, oid, value) = el(atv);
            let (_, value, _) = el(value);
            out.push((oid.to_vec(), String::from_utf8(value.to_vec()).unwrap()));
            rdns = next;
        }
        out
    }

    const CN: [u8; 3] = [0x55, 0x04, 0x03];
    const O: [u8; 3] = [0x55, 0x04, 0x0a];

    #[test]
    fn the_request_names_the_operator_user_and_no_group_with_a_fresh_p256_key() {
        let user = op::operator_user("demo");
        let a = new_request(&user, None).unwrap();
        assert!(a.csr_pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert_eq!(csr_subject(&a.csr_pem), vec![(CN.to_vec(), user.clone())]);
        assert!(a.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        // P-256: the prime256v1 OID in the PKCS#8 key.
        use base64::Engine as _;
        let key: String = a
            .key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let key = base64::engine::general_purpose::STANDARD
            .decode(key)
            .unwrap();
        let prime256v1 = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
        assert!(key.windows(8).any(|w| w == prime256v1));
        // Each request has its own key.
        let b = new_request(&user, None).unwrap();
        assert_ne!(a.key_pem, b.key_pem);
        assert!(!format!("{a:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn a_group_is_asked_for_only_when_given() {
        let r = new_request("system:admin", Some("system:masters")).unwrap();
        assert_eq!(
            csr_subject(&r.csr_pem),
            vec![
                (CN.to_vec(), "system:admin".to_owned()),
                (O.to_vec(), "system:masters".to_owned())
            ]
        );
    }

    #[test]
    fn a_401_is_the_credential_refused_and_other_answers_name_the_step() {
        let status = |code| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: "no".into(),
                ..Default::default()
            }))
        };
        assert!(matches!(
            ClientCsrError::api("create-csr", &status(401)),
            ClientCsrError::Unauthorized
        ));
        let e = ClientCsrError::api("approve-csr", &status(403));
        assert!(
            e.to_string()
                .starts_with("approve-csr: the API answered 403")
        );
        assert!(e.to_string().contains("--via ssh"));
    }
}
