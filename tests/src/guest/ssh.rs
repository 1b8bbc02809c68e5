//! The guest's sshd: the keys cloud-init installed, and the files on the VM's disk (uploads,
//! `write_files`, and what k3s writes on servers) as SSH sees them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use uuid::Uuid;

use super::cloud_init::{AuthorizedKey, parse_public_key};
use super::k3s_config::{
    K3S_AGENT_TOKEN_PATH, K3S_KUBECONFIG_PATH, K3S_NODE_TOKEN_PATH, K3S_TOKEN_PATH,
};
use super::k3s_service::RESET_FLAG_PATH;
use super::{Inner, K3sState};
use crate::guest::sshd::{BoxedRun, K3sCommand, SshBackend, SshHost};

impl Inner {
    pub(super) fn ssh_parts(
        self: &Arc<Self>,
        id: Uuid,
        via: SocketAddr,
    ) -> Option<(Arc<SshHost>, Arc<dyn SshBackend>)> {
        let st = self.state();
        let vm = st.vms.get(&id)?;
        let mut keys: Vec<AuthorizedKey> = vm
            .user_data
            .as_ref()
            .map(|u| u.authorized_keys.clone())
            .unwrap_or_default();
        keys.extend(
            vm.api_ssh_keys
                .iter()
                .filter_map(|k| parse_public_key(k))
                .map(|key| AuthorizedKey { user: None, key }),
        );
        // cc_ssh gives the instance's keys and the top-level `ssh_authorized_keys` to the default
        // user and to root behind the `disable_root` forced command ("Please login as the user
        // …", exit 142). Without a default user they reach root only, where that command ends
        // every session: no usable login (cloud-init@04eacd0 `cloudinit/config/cc_ssh.py:231-271`,
        // `cloudinit/ssh_util.py:60-65`). User-data cloud-init did not read as cloud-config
        // leaves the image's default user in place.
        let default_user = vm.user_data.as_ref().is_none_or(|u| u.default_user);
        if !default_user {
            keys.retain(|k| k.user.is_some());
        }
        let files = vm
            .user_data
            .as_ref()
            .map(|u| u.files.clone())
            .unwrap_or_default();
        let backend = VmBackend {
            via,
            boot: Arc::downgrade(self),
            id,
            generation: vm.generation,
            hostname: vm.hostname.clone(),
            keys,
            files,
        };
        Some((vm.ssh_host.clone(), Arc::new(backend)))
    }
}

impl Inner {
    /// Puts a file on VM `id`'s disk at guest path `path` (absolute, no `..`): held on the
    /// host under the simulator's upload directory with `mode` (0644 otherwise), and what
    /// `cat PATH` over SSH reads from then on.
    pub(super) fn put_vm_file(
        &self,
        id: Uuid,
        path: &str,
        data: &[u8],
        mode: Option<u32>,
    ) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt as _;
        // Absolute, no `..`: the guest path maps into the VM's directory and nowhere else.
        let rel = match path.strip_prefix('/') {
            Some(rel) if !rel.is_empty() && !rel.split('/').any(|c| c == ".." || c.is_empty()) => {
                rel
            }
            _ => return Err(format!("{path}: not an absolute guest path")),
        };
        let dir = self
            .vm_upload_dir(id)
            .ok_or_else(|| "no upload directory".to_owned())?;
        let host = dir.join(rel);
        host.parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&host, data))
            .and_then(|()| {
                std::fs::set_permissions(
                    &host,
                    std::fs::Permissions::from_mode(mode.unwrap_or(0o644) & 0o7777),
                )
            })
            .map_err(|e| e.to_string())?;
        let mut st = self.state();
        let vm = st.vms.get_mut(&id).ok_or_else(|| "no such VM".to_owned())?;
        vm.uploads.insert(path.to_owned(), host);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// ssh backend

/// What a server VM's sshd sees: the keys cloud-init installed (plus the instance's API keys)
/// and the files on its disk.
struct VmBackend {
    /// The address this sshd listens on (external, floating or tailnet).
    via: SocketAddr,
    boot: Weak<Inner>,
    id: Uuid,
    generation: u64,
    hostname: String,
    keys: Vec<AuthorizedKey>,
    files: BTreeMap<String, Vec<u8>>,
}

/// `/home/<user>/.ssh/authorized_keys`: sshd's default `AuthorizedKeysFile`
/// (`.ssh/authorized_keys` under the user's home: openssh-portable@0ef0f5a8 `servconf.c:383-392`,
/// `pathnames.h:112`) for a user cloud-init made (home `/home/<name>`), the file cloud-init wrote
/// the user's keys into (`cloudinit/ssh_util.py` `setup_user_keys`, code index id 1310031476).
pub fn authorized_keys_path(user: &str) -> String {
    format!("/home/{user}/.ssh/authorized_keys")
}

/// The user of an [`authorized_keys_path`].
fn authorized_keys_user(path: &str) -> Option<&str> {
    path.strip_prefix("/home/")?
        .strip_suffix("/.ssh/authorized_keys")
        .filter(|u| !u.is_empty() && !u.contains('/'))
}

impl VmBackend {
    /// The keys cloud-init installed for `user`.
    fn cloud_init_keys<'a>(&'a self, user: &'a str) -> impl Iterator<Item = &'a AuthorizedKey> {
        self.keys
            .iter()
            .filter(move |k| k.user.as_deref().map_or(user != "root", |u| u == user))
    }

    /// `user`'s `authorized_keys` as rewritten over SSH, read now: sshd reads the file at each
    /// authentication (`user_key_allowed` → `user_key_allowed2` → `auth_openkeyfile`,
    /// openssh-portable@0ef0f5a8 `auth2-pubkey.c:790-850`, `625-647`). `None` when nothing was
    /// written there (cloud-init's file stands); `Some(None)` when sshd would not use it: it
    /// opens the file as the user (`temporarily_use_uid`, `auth2-pubkey.c:636-639`), so a
    /// root-owned file others cannot read is unreadable, and StrictModes refuses a group- or
    /// world-writable one (`safe_path`, `misc.c:2319-2344`, through `auth_openfile`,
    /// `auth2-pubkeyfile.c:455-499`).
    fn written_authorized_keys(&self, user: &str) -> Option<Option<String>> {
        use std::os::unix::fs::PermissionsExt as _;
        if user == "root" {
            return None;
        }
        let inner = self.boot.upgrade()?;
        let path = authorized_keys_path(user);
        let (host, root) = {
            let st = inner.state();
            let vm = st.vms.get(&self.id)?;
            (
                vm.uploads.get(&path).cloned()?,
                vm.root_owned.contains(&path),
            )
        };
        let usable = std::fs::metadata(&host).ok().is_some_and(|m| {
            let mode = m.permissions().mode();
            mode & 0o022 == 0 && (!root || mode & 0o004 != 0)
        });
        Some(
            usable
                .then(|| std::fs::read_to_string(&host).ok())
                .flatten(),
        )
    }
}

impl SshBackend for VmBackend {
    fn authorized(&self, user: &str, key: &russh::keys::PublicKey) -> bool {
        let ok = match self.written_authorized_keys(user) {
            Some(text) => text.is_some_and(|t| {
                t.lines()
                    .filter_map(parse_public_key)
                    .any(|k| k.key_data() == key.key_data())
            }),
            None => self
                .cloud_init_keys(user)
                .any(|k| k.key.key_data() == key.key_data()),
        };
        if ok && let Some(inner) = self.boot.upgrade() {
            let mut st = inner.state();
            if let Some(vm) = st.vms.get_mut(&self.id) {
                if vm.ssh_logins.len() >= 32 {
                    vm.ssh_logins.remove(0);
                }
                vm.ssh_logins.push(self.via);
            }
        }
        ok
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn k3s(&self, command: K3sCommand) -> BoxedRun<'_> {
        Box::pin(async move {
            let Some(inner) = self.boot.upgrade() else {
                return (1, String::new(), "Connection closed\n".to_owned());
            };
            match command {
                K3sCommand::Stop => inner.k3s_service_stop(self.id, self.generation),
                K3sCommand::Start => inner.k3s_service_start(self.id, self.generation).await,
                K3sCommand::ClusterReset => inner.k3s_cluster_reset(self.id, self.generation).await,
                K3sCommand::EtcdSnapshotSave => {
                    inner.k3s_etcd_snapshot_save(self.id, self.generation).await
                }
                K3sCommand::DropServerUrl => inner.k3s_config_drop_server(self.id, self.generation),
                K3sCommand::RemoveResetFlag => {
                    inner.k3s_remove_reset_flag(self.id, self.generation)
                }
                K3sCommand::EtcdMemberList => {
                    inner.etcd_local_member_list(self.id, self.generation).await
                }
            }
        })
    }

    fn k3s_etcd_snapshot_delete(&self, name: String) -> BoxedRun<'_> {
        let ran = match self.boot.upgrade() {
            Some(inner) => inner.k3s_etcd_snapshot_delete(self.id, self.generation, &name),
            None => (1, String::new(), "Connection closed\n".to_owned()),
        };
        Box::pin(std::future::ready(ran))
    }

    fn write_file(&self, path: &str, data: &[u8]) -> bool {
        self.write_file_mode(path, data, None)
    }

    fn write_file_as(&self, path: &str, data: &[u8], mode: Option<u32>, root: bool) -> bool {
        if !self.write_file_mode(path, data, mode) {
            return false;
        }
        let Some(inner) = self.boot.upgrade() else {
            return false;
        };
        let mut st = inner.state();
        let Some(vm) = st.vms.get_mut(&self.id) else {
            return false;
        };
        if root {
            vm.root_owned.insert(path.to_owned());
        } else {
            vm.root_owned.remove(path);
        }
        true
    }

    /// The file keeps its owner and mode (a rename within one file system).
    fn rename(&self, from: &str, to: &str, _root: bool) -> bool {
        let Some(inner) = self.boot.upgrade() else {
            return false;
        };
        let mut st = inner.state();
        let Some(vm) = st.vms.get_mut(&self.id) else {
            return false;
        };
        let Some(host) = vm.uploads.remove(from) else {
            return false;
        };
        vm.uploads.insert(to.to_owned(), host);
        if vm.root_owned.remove(from) {
            vm.root_owned.insert(to.to_owned());
        } else {
            vm.root_owned.remove(to);
        }
        true
    }

    /// Stores the file on the host under the simulator's upload directory, with the mode the
    /// upload asked for (0644 otherwise), so a hostPath volume can run it.
    fn write_file_mode(&self, path: &str, data: &[u8], mode: Option<u32>) -> bool {
        let Some(inner) = self.boot.upgrade() else {
            return false;
        };
        match inner.put_vm_file(self.id, path, data, mode) {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(instance = %self.id, error = %err, "cannot store an uploaded file");
                false
            }
        }
    }

    fn read_file(&self, path: &str) -> Option<Vec<u8>> {
        if let Some(inner) = self.boot.upgrade() {
            let host = inner
                .state()
                .vms
                .get(&self.id)
                .and_then(|vm| vm.uploads.get(path).cloned());
            if let Some(host) = host {
                return std::fs::read(host).ok();
            }
        }
        if let Some(user) = authorized_keys_user(path) {
            let lines: String = self
                .cloud_init_keys(user)
                .filter_map(|k| k.key.to_openssh().ok())
                .map(|l| format!("{l}\n"))
                .collect();
            return (!lines.is_empty()).then(|| lines.into_bytes());
        }
        if path == RESET_FLAG_PATH {
            let inner = self.boot.upgrade()?;
            return inner.has_reset_flag(self.id).then(Vec::new);
        }
        if path == "/etc/hostname" {
            return Some(format!("{}\n", self.hostname).into_bytes());
        }
        if matches!(
            path,
            K3S_KUBECONFIG_PATH | K3S_NODE_TOKEN_PATH | K3S_TOKEN_PATH | K3S_AGENT_TOKEN_PATH
        ) {
            let inner = self.boot.upgrade()?;
            let (token, agent_token, api, ca_hash, certs_end) = {
                let st = inner.state();
                let vm = st.vms.get(&self.id)?;
                // k3s writes these once the server has started.
                if vm.generation != self.generation || vm.k3s != K3sState::Joined {
                    return None;
                }
                let cluster = st.cluster_of(self.id)?;
                (
                    cluster.token.clone(),
                    cluster.agent_token.clone(),
                    cluster.api.clone(),
                    cluster.ca_hash.clone(),
                    vm.certs_end,
                )
            };
            return Some(match path {
                K3S_KUBECONFIG_PATH => api
                    .admin_kubeconfig_until("https://127.0.0.1:6443", certs_end)
                    .into_bytes(),
                K3S_AGENT_TOKEN_PATH => format!("K10{ca_hash}::node:{agent_token}\n").into_bytes(),
                _ => format!("K10{ca_hash}::server:{token}\n").into_bytes(),
            });
        }
        self.files.get(path).cloned()
    }
}
