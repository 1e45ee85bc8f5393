//! Operating the lease records on etcd (filled in below).
