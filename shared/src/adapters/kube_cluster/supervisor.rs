//! k3s's supervisor, the HTTPS server a k3s server runs on the API's own port (`:6443`; the
//! apiserver behind it serves every path the supervisor does not): `GET /db/info` answers
//! the cluster's etcd member list to holders of the server token (basic auth user `server`),
//! as joining servers read it. Reached at the kubeconfig's (or the in-cluster) API address,
//! verified against the cluster CA that configuration carries, and never with its client
//! credentials: k3s's supervisor takes the first authenticator that succeeds, and an admin
//! certificate would succeed without the `k3s:server` group `/db/info` needs.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::domain::model::EtcdMember;
use crate::ports::cluster::ClusterError;

/// Time allowed for one `/db/info` answer (k3s gives its own MemberList 2 s).
const TIMEOUT: Duration = Duration::from_secs(10);

/// The supervisor behind the API address of one kube configuration.
#[derive(Clone)]
pub struct Supervisor {
    url: String,
    http: reqwest::Client,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// k3s's answer: `{"members": [...]}` (`pkg/etcd` `Members`).
#[derive(serde::Deserialize)]
struct Members {
    #[serde(default)]
    members: Vec<EtcdMember>,
}

impl Supervisor {
    /// The supervisor at `config`'s API address, trusting only `config`'s CA and checking
    /// its certificate for `tls-server-name` when the configuration sets one.
    pub fn from_config(config: &kube::Config) -> Result<Supervisor, String> {
        let roots =
            config.root_cert.as_ref().filter(|c| !c.is_empty()).ok_or(
                "the Kubernetes configuration carries no cluster CA to verify the API with",
            )?;
        let mut store = rustls::RootCertStore::empty();
        for der in roots {
            store
                .add(CertificateDer::from(der.clone()))
                .map_err(|e| format!("the cluster CA is unusable: {e}"))?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
            store.into(),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("the cluster CA is unusable: {e}"))?;
        let host = config.cluster_url.host().unwrap_or_default();
        let name = config.tls_server_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.trim_matches(['[', ']']).to_owned())
            .map_err(|e| format!("{name} is no TLS server name: {e}"))?;
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Named {
                inner: webpki,
                name,
            }))
            .with_no_client_auth();
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .no_proxy()
            .timeout(TIMEOUT)
            .connect_timeout(crate::adapters::kubeclient::CONNECT_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        let base = config.cluster_url.to_string();
        Ok(Supervisor {
            url: format!("{}/db/info", base.trim_end_matches('/')),
            http,
        })
    }

    /// `GET /db/info` as user `server` with the server token (its secret part, the password
    /// of k3s's `server` user, for a `K10<hash>::server:<secret>` token).
    pub async fn db_info(&self, server_token: &str) -> Result<Vec<EtcdMember>, ClusterError> {
        let what = || "the etcd member list (GET /db/info)".to_owned();
        let answer = self
            .http
            .get(&self.url)
            .basic_auth("server", Some(token_secret(server_token)))
            .send()
            .await
            .map_err(|e| ClusterError::Unavailable {
                what: what(),
                message: e.without_url().to_string(),
            })?;
        let code = answer.status().as_u16();
        let body = answer.text().await.map_err(|e| ClusterError::Unavailable {
            what: what(),
            message: e.without_url().to_string(),
        })?;
        let message = || {
            let m = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| body.chars().take(200).collect());
            format!("HTTP {code}: {m}")
        };
        match code {
            200 => serde_json::from_str::<Members>(&body)
                .map(|m| m.members)
                .map_err(|e| ClusterError::Api {
                    what: what(),
                    source: Box::new(e),
                }),
            401 | 403 => Err(ClusterError::Forbidden {
                what: what(),
                message: format!(
                    "{}; the Secret's k3s token is not the cluster's server token",
                    message()
                ),
            }),
            _ => Err(ClusterError::Unavailable {
                what: what(),
                message: message(),
            }),
        }
    }
}

/// The password of a k3s token: a bare token is the password itself; a full token is
/// `K10<ca hash>::<user>:<password>`.
fn token_secret(token: &str) -> &str {
    match token.strip_prefix("K10").and_then(|r| r.split_once("::")) {
        Some((_, creds)) => creds.split_once(':').map_or(creds, |(_, pass)| pass),
        None => token,
    }
}

/// Verifies the server's chain against the cluster CA for one fixed name (the
/// configuration's `tls-server-name`, else the API address), whatever address was dialled.
#[derive(Debug)]
struct Named {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for Named {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_basic_auth_password_is_the_tokens_secret() {
        assert_eq!(token_secret("abc123"), "abc123");
        assert_eq!(token_secret("K10deadbeef::server:abc123"), "abc123");
    }

    #[test]
    fn k3s_member_json_is_read_as_go_marshals_it() {
        let body = r#"{"members":[{"ID":13803658152347727308,"name":"c-control-plane-aaaaa-1f2e3d4c","peerURLs":["https://172.30.0.5:2380"],"clientURLs":["https://172.30.0.5:2379"]},{"ID":5,"peerURLs":["https://172.30.0.6:2380"],"isLearner":true}]}"#;
        let m: Members = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.members.len(), 2);
        assert_eq!(m.members[0].id, 13803658152347727308);
        assert_eq!(m.members[0].node_name(), Some("c-control-plane-aaaaa"));
        assert!(!m.members[0].is_learner);
        assert!(m.members[1].is_learner && m.members[1].name.is_empty());
        assert_eq!(m.members[1].node_name(), None);
    }
}
