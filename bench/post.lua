-- wrk: POST the review in $GPUGUARD_BODY to /mutate, as the apiserver does.
local file = io.open(os.getenv("GPUGUARD_BODY"), "rb")
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"
