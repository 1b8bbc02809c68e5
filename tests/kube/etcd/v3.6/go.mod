module github.com/oxide-controller/tests/kube/etcd/v3.6

go 1.24.0
