-- wrk: the review POST of post.lua, paced: each connection waits `GPUGUARD_DELAY_MS` after every response.
dofile(os.getenv("GPUGUARD_POST_LUA"))
local pause = tonumber(os.getenv("GPUGUARD_DELAY_MS") or "5")
function delay()
  return pause
end
