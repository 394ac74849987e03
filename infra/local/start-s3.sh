#!/usr/bin/env bash
# An S3 endpoint on loopback without docker: moto's server (the API MinIO serves in
# docker-compose.yml) on the host and port of STATE_S3_ENDPOINT_URL, with the checkpoint
# bucket of STATE_CHECKPOINT_ROOT created. Objects live in memory until infra/local/stop.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
set -a; . infra/local/state.env; set +a
python=${PYTHON:-.venv/bin/python}

read -r host port bucket < <("$python" - <<'PY'
import os
from urllib.parse import urlparse
endpoint = urlparse(os.environ["STATE_S3_ENDPOINT_URL"])
print(endpoint.hostname, endpoint.port or 80, urlparse(os.environ["STATE_CHECKPOINT_ROOT"]).netloc)
PY
)

mkdir -p .local
if [ -f .local/moto.pid ] && kill -0 "$(cat .local/moto.pid)" 2>/dev/null; then
  echo "moto server already running (pid $(cat .local/moto.pid))"
else
  nohup "$(dirname "$python")/moto_server" -H "$host" -p "$port" >.local/moto.log 2>&1 &
  echo $! >.local/moto.pid
  echo "started moto S3 server on $host:$port (pid $!, log .local/moto.log)"
fi

"$python" - "$bucket" <<'PY'
import os, sys, time
import boto3

s3 = boto3.client("s3", endpoint_url=os.environ["STATE_S3_ENDPOINT_URL"])
for _ in range(100):
    try:
        s3.list_buckets()
        break
    except Exception:
        time.sleep(0.1)
else:
    sys.exit(f"no S3 endpoint answers at {os.environ['STATE_S3_ENDPOINT_URL']}")
bucket = sys.argv[1]
if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
    s3.create_bucket(Bucket=bucket)
print(f"bucket ready: s3://{bucket} at {os.environ['STATE_S3_ENDPOINT_URL']}")
PY
