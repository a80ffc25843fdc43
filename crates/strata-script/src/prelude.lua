-- Seals a fresh Lua state the way Redis 7 seals its scripting VM. Runs once, with the
-- state's own globals; receives the kill check (a Rust function that raises once the
-- running script has been killed). Returns the table of runtime globals and the metatable
-- of the (now empty) global table, whose __index the caller may point elsewhere (function
-- libraries load against their own small environment).
local check_killed = ...
local error_, type_, tostring_, pairs_, select_, unpack_ =
    error, type, tostring, pairs, select, unpack
local rawset_, setmetatable_, pcall_, xpcall_, loadstring_ =
    rawset, setmetatable, pcall, xpcall, loadstring
local G = _G

local protected = {}
local function readonly()
    error_("Attempt to modify a readonly table", 2)
end
-- What getmetatable answers for a sealed table: writing to it fails too.
local guard = setmetatable_({}, { __newindex = readonly, __metatable = false })
protected[guard] = true
local function seal(real)
    local proxy = setmetatable_({}, { __index = real, __newindex = readonly, __metatable = guard })
    protected[proxy] = true
    return proxy
end
local function nonexistent(_, k)
    error_("Script attempted to access nonexistent global variable '" .. tostring_(k) .. "'", 2)
end

local runtime = {}
for k, v in pairs_(G) do
    runtime[k] = v
end
for _, name in pairs_({ "dofile", "loadfile", "print", "require", "module", "gcinfo" }) do
    runtime[name] = nil
end
runtime.rawset = function(t, k, v)
    if protected[t] then readonly() end
    return rawset_(t, k, v)
end
runtime.setmetatable = function(t, m)
    if protected[t] then readonly() end
    return setmetatable_(t, m)
end
-- Source only: a precompiled chunk could break the VM's invariants.
runtime.loadstring = function(s, name)
    if type_(s) == "string" and s:byte(1) == 27 then
        return nil, "binary chunks are not allowed"
    end
    return loadstring_(s, name)
end
-- A killed script stays killed: pcall and xpcall do not swallow the kill.
local function after(...)
    check_killed()
    return ...
end
runtime.pcall = function(...) return after(pcall_(...)) end
runtime.xpcall = function(...) return after(xpcall_(...)) end
for _, name in pairs_({ "string", "math", "table", "redis", "cjson", "cmsgpack", "bit", "struct" }) do
    if runtime[name] ~= nil then
        runtime[name] = seal(runtime[name])
    end
end
runtime._G = G
setmetatable_(runtime, { __index = nonexistent, __newindex = readonly })

local keys = {}
for k in pairs_(G) do
    keys[#keys + 1] = k
end
for i = 1, #keys do
    G[keys[i]] = nil
end
local meta = { __index = runtime, __newindex = readonly, __metatable = guard }
setmetatable_(G, meta)
protected[G] = true
return runtime, meta, seal, nonexistent
