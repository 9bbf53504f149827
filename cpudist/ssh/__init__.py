"""The transport to the nodes: paramiko sessions (client), pinned host keys (known_hosts), the
cluster's own key and ssh_config (keys), `hosts ssh-setup` (setup), and the launchers' ssh probe of
every node (reach)."""
