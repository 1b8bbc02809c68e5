module github.com/oxide-controller/tests/kube/etcd/v3.5

go 1.24.0
