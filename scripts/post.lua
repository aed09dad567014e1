-- wrk script of peers.sh and cpu-per-request.sh: every request POSTs the
-- JSON file named by the environment variable BODY.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open(os.getenv("BODY")); wrk.body = f:read("*a"); f:close()
