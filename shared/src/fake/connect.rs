//! [`FakeConnect`]: the bootstrap workflow's ports over one [`FakeWorld`]. The rack is
//! [`FakeRack`] (which also imports images, through the world's
//! [`MemoryImageStore`](crate::adapters::image::fake::MemoryImageStore)); the API answers `/readyz`
//! once the VM holding the API floating IP runs; SSH reaches that VM, checks its host key
//! ([`super::host_fingerprint`]) against the pins and serves a k3s.yaml; the in-cluster
//! ports are [`FakeState`], [`FakeCluster`] and [`FakeManifests`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::{FakeCluster, FakeRack, FakeState, FakeWorld};
use crate::adapters::dev_image::{Built, DevImage, DevImageError};
use crate::adapters::image::{ImageStore, ImportDisk, NewImage, Snapshot};
use crate::adapters::ssh::{CommandOutput, HostKeyPins, RemoteShell, SshError, SshKeyPair};
use crate::adapters::tailscale::{self, Device, SecretString, TailscaleError};
use crate::base::retry::Backoff;
use crate::domain::model::{Image, InstanceState};
use crate::ports::rack::RackError;
use crate::render::manifests::{Manifest, ManifestError, Retired};
use crate::workflows::bootstrap::{
    ApiAnswer, ApplyManifests, Connect, ConnectError, InClusterPorts, K3S_KUBECONFIG_PATH, Tailnet,
};

/// A k3s.yaml as k3s writes it (server 127.0.0.1, names `default`).
pub const K3S_YAML: &str = "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCmZha2UgY2EKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
    server: https://127.0.0.1:6443
  name: default
contexts:
- context:
    cluster: default
    user: default
  name: default
current-context: default
kind: Config
preferences: {}
users:
- name: default
  user:
    client-certificate-data: ZmFrZSBjZXJ0
    client-key-data: ZmFrZSBrZXk=
";

/// Bootstrap's ports over `world`.
#[derive(Debug, Clone)]
pub struct FakeConnect {
    pub world: FakeWorld,
}

impl FakeConnect {
    pub fn new(world: FakeWorld) -> FakeConnect {
        FakeConnect { world }
    }

    /// The instance the floating IP with address `ip` is attached to, and its state.
    fn holder_of(&self, ip: std::net::IpAddr) -> Option<(String, InstanceState)> {
        self.world.with(|s| {
            let fip = s.floating_ips.values().find(|f| f.ip == ip)?;
            let id = fip.instance_id?;
            s.instances
                .values()
                .find(|i| i.id == id)
                .map(|i| (i.name.clone(), i.state.clone()))
        })
    }
}

impl Connect for FakeConnect {
    type Rack = FakeRack;
    type Shell = FakeVm;
    type Store = FakeState;
    type Cluster = FakeCluster;
    type Manifests = FakeManifests;
    type Tailnet = FakeTailnet;

    fn rack(&self, _host: &str, _token: &str, _project: &str) -> Result<FakeRack, RackError> {
        Ok(self.world.rack())
    }

    fn tailnet(
        &self,
        api_url: &str,
        tailnet: &str,
        _api_key: SecretString,
    ) -> Result<FakeTailnet, TailscaleError> {
        tailscale::check_base_url(api_url)?;
        Ok(FakeTailnet {
            world: self.world.clone(),
            name: tailnet.to_owned(),
        })
    }

    /// The fakes run no cargo: a dev source fails as a build would, naming why.
    async fn build_controller(
        &self,
        dev: &DevImage,
        _profile: &str,
    ) -> Result<Built, DevImageError> {
        Err(DevImageError::Build {
            path: dev.path.display().to_string(),
            message: "the in-memory fakes build no binaries".into(),
        })
    }

    /// A documentation address (RFC 5737): the fakes have no network to route over.
    async fn source_address(&self, _host: &str) -> Result<std::net::IpAddr, String> {
        Ok(std::net::IpAddr::from([192, 0, 2, 10]))
    }

    /// The live reader: image sources in the fakes' tests are local files or loopback URLs.
    fn image_sources(&self) -> Result<reqwest::Client, ConnectError> {
        crate::workflows::live::image_source_client()
    }

    /// Ready while the API address's holder runs (the fakes have no datastore to lose).
    async fn api_ready(&self, _kubeconfig: &std::path::Path, _context: &str) -> Result<(), String> {
        let ips: Vec<_> = self
            .world
            .with(|s| s.floating_ips.values().map(|f| f.ip).collect());
        if ips
            .into_iter()
            .any(|ip| matches!(self.holder_of(ip), Some((_, InstanceState::Running))))
        {
            Ok(())
        } else {
            Err("nothing answers at the API address".to_owned())
        }
    }

    async fn probe_api(&self, url: &str) -> Result<ApiAnswer, String> {
        let ip = self.world.with(|s| {
            s.floating_ips
                .values()
                .map(|f| f.ip)
                .find(|ip| url.starts_with(&crate::domain::spec::server_url(*ip)))
        });
        Ok(match ip.and_then(|ip| self.holder_of(ip)) {
            Some((_, InstanceState::Running)) => ApiAnswer::Status(200),
            _ => ApiAnswer::NotListening,
        })
    }

    fn shell(&self, addr: SocketAddr, _user: &str, _key: SshKeyPair, pins: HostKeyPins) -> FakeVm {
        FakeVm {
            connect: self.clone(),
            addr,
            pins,
        }
    }

    async fn in_cluster(
        &self,
        kubeconfig: &Path,
        _context: &str,
        _holder: &str,
    ) -> Result<InClusterPorts<FakeState, FakeCluster, FakeManifests>, ConnectError> {
        if !kubeconfig.exists() {
            return Err(format!("no kubeconfig at {}", kubeconfig.display()).into());
        }
        Ok(InClusterPorts {
            store: self.world.state(),
            cluster: self.world.cluster(),
            manifests: FakeManifests(self.world.clone()),
        })
    }
}

/// The tailnet, in memory: every running instance of the world has joined it under its
/// name, with an address in Tailscale's 100.64.0.0/10 derived from its id.
#[derive(Debug, Clone)]
pub struct FakeTailnet {
    world: FakeWorld,
    name: String,
}

impl Tailnet for FakeTailnet {
    fn name(&self) -> &str {
        &self.name
    }

    async fn devices(&self) -> Result<Vec<Device>, TailscaleError> {
        Ok(self.world.with(|s| {
            s.instances
                .values()
                .filter(|i| matches!(i.state, InstanceState::Running))
                .map(|i| {
                    let b = i.id.as_bytes();
                    let ip = Ipv4Addr::new(100, 64 | (b[0] & 63), b[1], b[2].max(1));
                    Device {
                        hostname: i.name.clone(),
                        name: format!("{}.{}.ts.net", i.name, self.name),
                        addresses: vec![ip.to_string()],
                        ..Device::default()
                    }
                })
                .collect()
        }))
    }
}

/// The VM behind an address, over "SSH": reachable once it runs, and only with its host key
/// pinned.
#[derive(Debug, Clone)]
pub struct FakeVm {
    connect: FakeConnect,
    addr: SocketAddr,
    pins: HostKeyPins,
}

impl FakeVm {
    /// The pinned VM's name, or why there is none to talk to.
    fn reach(&self) -> Result<String, SshError> {
        let addr = self.addr;
        match self.connect.holder_of(addr.ip()) {
            Some((name, InstanceState::Running)) => {
                let presented = super::host_fingerprint(&name);
                if self.pins.is_empty() {
                    return Err(SshError::NoPins { addr });
                }
                if !self.pins.fingerprints().any(|p| p == presented) {
                    return Err(SshError::HostKeyMismatch {
                        addr,
                        presented,
                        expected: self.pins.fingerprints().map(str::to_owned).collect(),
                    });
                }
                Ok(name)
            }
            _ => Err(SshError::ConnectTimeout {
                addr,
                timeout: Duration::from_secs(1),
            }),
        }
    }
}

impl RemoteShell for FakeVm {
    fn exec<'a>(&'a self, _cmd: &'a str) -> BoxFuture<'a, Result<CommandOutput, SshError>> {
        Box::pin(async move {
            self.reach()?;
            Ok(CommandOutput::default())
        })
    }

    fn read_file<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, SshError>> {
        Box::pin(async move {
            self.reach()?;
            if path == K3S_KUBECONFIG_PATH {
                return Ok(K3S_YAML.as_bytes().to_vec());
            }
            Err(SshError::ReadFile {
                addr: self.addr,
                path: path.to_owned(),
                exit_status: 1,
                stderr: format!("cat: {path}: No such file or directory"),
            })
        })
    }

    fn upload<'a>(
        &'a self,
        _path: &'a str,
        _bytes: &'a [u8],
        _mode: u32,
    ) -> BoxFuture<'a, Result<(), SshError>> {
        Box::pin(async move {
            self.reach()?;
            Ok(())
        })
    }
}

/// Applies manifests into the world's `applied` set; labels the world's Nodes.
#[derive(Debug, Clone)]
pub struct FakeManifests(pub FakeWorld);

impl ApplyManifests for FakeManifests {
    async fn apply_all(
        &self,
        manifests: &[Manifest],
        _retry: Backoff,
    ) -> Result<usize, ManifestError> {
        self.0.with(|s| {
            for m in manifests {
                s.applied.insert(m.describe());
            }
        });
        Ok(manifests.len())
    }

    async fn delete_retired(
        &self,
        objects: &[Retired],
        _retry: Backoff,
    ) -> Result<usize, ManifestError> {
        Ok(self.0.with(|s| {
            objects
                .iter()
                .filter(|r| s.applied.remove(&r.describe()))
                .count()
        }))
    }

    async fn label_node(&self, node: &str, label: &str, value: &str) -> Result<(), String> {
        self.0.with(|s| match s.nodes.get_mut(node) {
            Some(n) => {
                n.labels.insert(label.to_owned(), value.to_owned());
                Ok(())
            }
            None => Err(format!("nodes \"{node}\" not found")),
        })
    }
}

/// Image imports go to the world's memory image store; the images it makes join the world's.
impl ImageStore for FakeRack {
    async fn find_image(&self, name: &str) -> Result<Option<Image>, RackError> {
        Ok(self.0.with(|s| {
            let project = s.images.iter().find(|i| i.name == name && !i.silo_scoped);
            let silo = s.images.iter().find(|i| i.name == name && i.silo_scoped);
            project.or(silo).cloned()
        }))
    }

    async fn import_disk(&self, name: &str) -> Result<Option<ImportDisk>, RackError> {
        self.images().import_disk(name).await
    }

    async fn create_import_disk(
        &self,
        name: &str,
        description: &str,
        size: u64,
        block_size: u64,
    ) -> Result<(), RackError> {
        self.0
            .with(|s| s.create_calls.push(format!("create-import-disk {name}")));
        self.images()
            .create_import_disk(name, description, size, block_size)
            .await
    }

    async fn bulk_write_start(&self, disk: &str) -> Result<(), RackError> {
        self.images().bulk_write_start(disk).await
    }

    async fn bulk_write(&self, disk: &str, offset: u64, data: Bytes) -> Result<(), RackError> {
        self.images().bulk_write(disk, offset, data).await
    }

    async fn bulk_write_stop(&self, disk: &str) -> Result<(), RackError> {
        self.images().bulk_write_stop(disk).await
    }

    async fn finalize_import(&self, disk: &str, snapshot: Option<&str>) -> Result<(), RackError> {
        self.images().finalize_import(disk, snapshot).await
    }

    async fn create_snapshot(
        &self,
        name: &str,
        description: &str,
        disk: &str,
    ) -> Result<(), RackError> {
        self.0
            .with(|s| s.create_calls.push(format!("create-snapshot {name}")));
        self.images()
            .create_snapshot(name, description, disk)
            .await?;
        // The project's snapshot list (the `Rack` side) shows it too.
        self.0.with(|s| {
            s.snapshots.insert(
                name.to_owned(),
                crate::domain::model::Snapshot {
                    id: uuid::Uuid::new_v4(),
                    name: name.to_owned(),
                    description: description.to_owned(),
                    disk_id: uuid::Uuid::nil(),
                },
            )
        });
        Ok(())
    }

    async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, RackError> {
        self.images().snapshot(name).await
    }

    async fn delete_snapshot(&self, name: &str) -> Result<(), RackError> {
        ImageStore::delete_snapshot(&self.images(), name).await
    }

    async fn delete_disk(&self, name: &str) -> Result<(), RackError> {
        ImageStore::delete_disk(&self.images(), name).await
    }

    async fn create_image(&self, image: &NewImage) -> Result<Image, RackError> {
        self.0
            .with(|s| s.create_calls.push(format!("create-image {}", image.name)));
        let made = self.images().create_image(image).await?;
        self.0.with(|s| s.images.push(made.clone()));
        Ok(made)
    }
}

impl FakeRack {
    fn images(&self) -> crate::adapters::image::fake::MemoryImageStore {
        self.0.with(|s| s.image_store.clone())
    }
}
