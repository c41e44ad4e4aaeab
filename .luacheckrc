-- luacheck settings for the Redis Lua scripts (./bootstrap check runs `luacheck collector`).
--
-- Redis runs each script as one chunk: collector/_redis.py's REPLAY_LUA, then the backend's
-- lua/prelude.lua, then the script's own file. A script therefore sees the prelude's top-level
-- locals (key names, record fields, helpers) as upvalues. Checked file by file, the names the
-- prelude defines at top level (`local NAME`, `local function NAME`, read here from the files
-- themselves, so they are named once) are read-only globals of the scripts after it; writing one
-- is a warning, and so is reading any other global. The prelude's own top-level names are unused
-- in its file by construction (not a warning there; tests/test_lua_scripts.py checks that each
-- is used by a script).
std = "lua51"
max_line_length = 100
-- What Redis gives every script (https://redis.io/docs/latest/develop/interact/programmability/lua-api/)
read_globals = {"redis", "KEYS", "ARGV", "cjson", "cmsgpack", "struct", "bit"}

local here = debug.getinfo(1, "S").source:match("^@(.*)[/\\]") or "."

-- the names defined by `local ...` / `local function ...` at column 0 of a file
local function top_level_names(path)
  local names = {}
  local file = assert(io.open(here .. "/" .. path, "r"))
  for line in file:lines() do
    local fn = line:match("^local function ([%a_][%w_]*)")
    local vars = line:match("^local ([%a_][%w_, ]*)=")
    if fn then
      names[#names + 1] = fn
    elseif vars then
      for name in vars:gmatch("[%a_][%w_]*") do names[#names + 1] = name end
    end
  end
  file:close()
  assert(#names > 0, path .. ": no top-level names found")
  return names
end

-- REPLAY_LUA's functions (replayed, remember), from its text in collector/_redis.py
local replay = top_level_names("collector/_redis.py")

for _, backend in ipairs({"collector/frontier/lua", "collector/deadletter/lua"}) do
  local prelude = backend .. "/prelude.lua"
  local seen = {}
  for _, name in ipairs(replay) do seen[#seen + 1] = name end
  for _, name in ipairs(top_level_names(prelude)) do seen[#seen + 1] = name end
  files[backend .. "/*.lua"] = {read_globals = seen}
  -- the prelude defines its names for the scripts; it reads REPLAY_LUA's
  local unused = {}
  for _, name in ipairs(top_level_names(prelude)) do unused[#unused + 1] = "211/" .. name end
  files[prelude] = {read_globals = replay, ignore = unused}
end
