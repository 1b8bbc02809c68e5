// Command etcd is one member of a real etcd cluster for the simulated k3s releases whose
// bundled etcd is v3.5.x: etcd's own server (embed), built from the etcd module version a
// go.*.mod file in this directory pins (tests/kube/etcd/build.sh builds one binary per pinned
// version, named by it). The flags are those of `kcp etcd`:
//
//	etcd --name NAME --data-dir DIR --listen-client-url URL --listen-peer-url URL
//	     [--advertise-client-url URL] [--advertise-peer-url URL]
//	     [--initial-cluster NAME=URL,...] [--initial-cluster-state new|existing]
//	     [--force-new-cluster] [--restore-snapshot FILE]
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/wal"
	"go.uber.org/zap"
)

func main() {
	exitWithParent()
	os.Exit(runEtcd())
}

// exitWithParent ends the process once the process that started it (KCP_PARENT_PID, the
// test binary) is gone, so a test killed mid-run leaves no control plane behind.
func exitWithParent() {
	want := os.Getenv("KCP_PARENT_PID")
	if want == "" {
		return
	}
	go func() {
		for {
			if fmt.Sprint(os.Getppid()) != want {
				os.Exit(3)
			}
			time.Sleep(time.Second)
		}
	}()
}

// runEtcd runs one member of a real etcd cluster (embed.Config, etcd's own server), with the
// settings k3s's managed etcd gives a server (k3s-io/k3s pkg/etcd `cluster`): its name, its
// client and peer URLs, and the initial cluster it starts or joins (`new` for the
// cluster-init server, `existing` for a member added through the member API first),
// or --force-new-cluster, which k3s's --cluster-reset uses to make a member that kept its data
// the only one. Without fsync: test data need not survive a power cut. Membership is etcd's
// own (its Raft); nothing here decides who is a member.
//
// --restore-snapshot FILE first restores the snapshot file into --data-dir, as k3s's
// `--cluster-reset-restore-path` does (k3s-io/k3s pkg/etcd `Restore`: etcdutl's
// `snapshot.NewV3(...).Restore` with this member's name and peer URL as the whole initial
// cluster, the snapshot's appended sha256 checked), then starts the member from it, which is
// then the only member of a new cluster holding the snapshot's keys.
func runEtcd() int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	name := fs.String("name", "default", "member name")
	dir := fs.String("data-dir", "", "data directory (required)")
	client := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL")
	peer := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL")
	advClient := fs.String("advertise-client-url", "", "client URL advertised to the cluster (default: --listen-client-url)")
	advPeer := fs.String("advertise-peer-url", "", "peer URL advertised to the cluster (default: --listen-peer-url)")
	initial := fs.String("initial-cluster", "", "name=peerURL,... (default: this member alone)")
	state := fs.String("initial-cluster-state", "new", "new (a new cluster) or existing (join one this member was added to)")
	forceNew := fs.Bool("force-new-cluster", false, "drop every other member, keeping the data (k3s --cluster-reset)")
	restore := fs.String("restore-snapshot", "", "restore this etcd snapshot file into --data-dir (which must not hold data) before starting")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	urls := map[string]*url.URL{}
	for flagName, raw := range map[string]string{
		"listen-client-url": *client, "listen-peer-url": *peer,
		"advertise-client-url": *advClient, "advertise-peer-url": *advPeer,
	} {
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			fmt.Fprintf(os.Stderr, "etcd: --%s: %v\n", flagName, err)
			return 2
		}
		urls[flagName] = u
	}
	pick := func(adv, listen string) url.URL {
		if u, ok := urls[adv]; ok {
			return *u
		}
		return *urls[listen]
	}
	// Each WAL segment is preallocated on disk (64 MB upstream); a cluster runs a member per
	// server, and test data is small, so smaller segments keep a test's disk use down.
	wal.SegmentSizeBytes = 8 * 1000 * 1000
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dir
	cfg.UnsafeNoFsync = true
	cfg.ListenClientUrls = []url.URL{*urls["listen-client-url"]}
	cfg.AdvertiseClientUrls = []url.URL{pick("advertise-client-url", "listen-client-url")}
	cfg.ListenPeerUrls = []url.URL{*urls["listen-peer-url"]}
	cfg.AdvertisePeerUrls = []url.URL{pick("advertise-peer-url", "listen-peer-url")}
	cfg.InitialCluster = *initial
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	}
	cfg.ClusterState = *state
	cfg.ForceNewCluster = *forceNew
	cfg.LogLevel = "warn"
	if *restore != "" {
		if err := restoreSnapshot(*restore, cfg); err != nil {
			fmt.Fprintf(os.Stderr, "etcd: restoring %s: %v\n", *restore, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "etcd: restored %s into %s\n", *restore, cfg.Dir)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	defer e.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// A member restarted while most of its peers are down is not ready (it cannot publish
	// itself without quorum) and waits for them, as a real one does: no deadline here.
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: member %s ready\n", cfg.Name)
	case <-sig:
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-e.Server.StopNotify():
		fmt.Fprintln(os.Stderr, "etcd: server stopped (removed from the cluster?)")
		return 1
	}
	select {
	case <-sig:
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-e.Server.StopNotify():
		fmt.Fprintln(os.Stderr, "etcd: server stopped (removed from the cluster?)")
		return 1
	}
}

// restoreSnapshot is `etcdutl snapshot restore FILE --name NAME --data-dir DIR
// --initial-advertise-peer-urls URL --initial-cluster NAME=URL` (etcd-io/etcd
// etcdutl/snapshot/v3_snapshot.go `Restore`): it refuses a data dir that holds anything and a
// snapshot whose appended sha256 does not match, and writes a data dir whose membership is this
// member alone.
func restoreSnapshot(file string, cfg *embed.Config) error {
	peer := cfg.AdvertisePeerUrls[0].String()
	lg, err := zap.NewProduction()
	if err != nil {
		return err
	}
	defer func() { _ = lg.Sync() }()
	return snapshot.NewV3(lg.WithOptions(zap.IncreaseLevel(zap.WarnLevel))).Restore(snapshot.RestoreConfig{
		SnapshotPath:        file,
		Name:                cfg.Name,
		OutputDataDir:       cfg.Dir,
		OutputWALDir:        filepath.Join(cfg.Dir, "member", "wal"),
		PeerURLs:            []string{peer},
		InitialCluster:      cfg.Name + "=" + peer,
		InitialClusterToken: cfg.InitialClusterToken,
	})
}
