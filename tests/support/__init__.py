"""What the tests share, imported as ``from tests.support.<module> import ...``.

* ``ports``: free local ports (one, or a run of consecutive ones);
* ``waiting``: ``wait_for(condition, what, timeout)``, the one poll-until-true;
* ``word_count``: the word-count topology every in-process test runs (one definition), its
  config and input;
* ``logs``: :class:`~tests.support.logs.PausableLog`, whose standby replay can be held;
* ``stores``: the ``store_factory`` fixture (real RocksDB stores under ``tmp_path``);
* ``http_client``: a plain HTTP GET that reports a refused connection as status 0;
* ``query_cluster``: word-count instances in this process, each with a query server;
* ``replica_group``: ``examples/wordcount`` as a local replica group on a SQLite log,
  as the failover test, the failover benchmark and the replica-group e2e tests start it;
* ``control_plane``: the real control plane (kube-apiserver, etcd, controller manager,
  scheduler), the kubelet stand-in and the operator harness; ``k8s_objects``: StreamApp,
  pod and node bodies for the operator's unit tests; ``crd_schema``: a custom resource's
  structural-schema and CEL admission, in-process, for the CRD's unit tests;
* ``cluster_word_count``: input lines for the word count on a cluster, and the check that
  its counts through the query Service are exact; ``wordcount_app``: ``examples/wordcount``
  as it ships, deployed on the control plane with its log on a broker, and the counts it
  must answer (node-loss and scale-in e2e tests); ``control_plane.restore_app``: the word
  count on one pod with ``spec.restore`` (the restore-Job e2e tests);
* ``assignor_groups``: the hypothesis strategies (groups, histories, reported lags) and the
  checks the assignor's property tests share;
* ``prometheus``: the real ``promtool`` and Prometheus server, built from their Go module
  (``promtool check metrics`` on an endpoint's text, ``promtool test rules`` on the chart's alerts);
* ``kafka``: every Kafka stand-in: real brokers, librdkafka's mock cluster with its
  C-API hooks (``kafka.mock_cluster``), the adapter's fake clients (``kafka.fake_clients``).

Fixtures are registered once, by ``pytest_plugins`` in ``tests/conftest.py``. A test
module defines no ``wait_for`` or free-port helper of its own
(``tests/test_support_is_shared.py`` checks that).
"""
