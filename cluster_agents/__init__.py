"""The in-cluster agents: programs the charts ship as files in ConfigMaps and run on the pinned
``python`` image, unattended, for months. Standard library only (``tests/k8s/test_k8s_agents.py``
starts each from its ConfigMap's files alone), and nothing of the project is imported: the charts
(:mod:`k8s.agent`) and the metric table (:mod:`observability.metrics`) import them, downward.

Modules:
    agent_core         what every agent shares: the API-server client, one HTTP request to a replica,
                       the Prometheus text, the health and metrics server, the fs:// directory of a Pod.
    l2_janitor         per L2 line: deletes chunks by age and watermarks, never a live directory or a
                       pinned chunk; a pass every 10 minutes (:mod:`k8s.janitor`).
    l2_directories     which model directories of a line's L2 a janitor pass keeps, and their history.
    hot_prefixes       per line with hot prefixes, inside the janitor's process: warms, pins and
                       restores the line's shared prefixes through its replicas.
    l2_mount_watchdog  per HyperPod node: classifies every Pod's L2 mount and restarts Pods whose mount
                       died (:mod:`k8s.mount_watchdog`).
    node_firewall      per HyperPod node: the nftables ruleset of Curvine's host-network ports (the one
                       renderer) and the agent that keeps it loaded from the Nodes and Curvine's pods
                       (:mod:`k8s.node_firewall`).
    kv_canary          per L2 line: proves cross-pod hits with a request to one replica and then another
                       (:mod:`k8s.canary`).
"""
