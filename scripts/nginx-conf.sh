#!/usr/bin/env bash
# Prints the nginx configuration that peers.sh, streams.sh and
# cpu-per-request.sh run nginx with, as warmroute is run: one worker,
# keep-alive to the two upstreams, no response buffering, bodies up to
# 64 MiB held in memory, files (pid, logs, temporary bodies) under DIR.
#   scripts/nginx-conf.sh DIR LISTEN UPSTREAM1 UPSTREAM2 >DIR/nginx.conf
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: scripts/nginx-conf.sh DIR LISTEN UPSTREAM1 UPSTREAM2" >&2; exit 2; }
dir=$1 listen=$2 u1=$3 u2=$4
cat <<NGINX
worker_processes 1;
worker_rlimit_nofile 20000;
daemon off;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
events { worker_connections 19900; }
http {
  access_log off;
  client_body_temp_path $dir/nginx-body;
  proxy_temp_path $dir/nginx-proxy;
  upstream up { server $u1; server $u2; keepalive 256; }
  server {
    listen $listen;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX
