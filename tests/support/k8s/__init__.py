"""A Kubernetes API server emulator and a cluster stand-in, for tests without a cluster.

``apiserver.py`` serves the API the real ``kubectl``, kopf and Helm talk to;
``crd_schema.py`` is what it does with custom resources (defaults, pruning, CEL);
``cluster.py`` plays StatefulSet controller, scheduler, kubelet and Service proxy;
``kubectl.py`` runs the machine's real ``kubectl`` against the emulator.
"""
