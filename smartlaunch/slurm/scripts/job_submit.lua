--[[
smartlaunch example admin policy for slurmctld (JobSubmitPlugins=lua; this file goes beside
slurm.conf as job_submit.lua). The server-side companion of the admin policy file: it caps
the GPUs one job may request, however Slurm spells the request:

  --gres=gpu:N / --gres=gpu:type:N / --gpus-per-node=N  -> job_desc.tres_per_node
  --gpus=N / -G N                                        -> job_desc.tres_per_job
  --gpus-per-task=N                                      -> job_desc.tres_per_task
  --gpus-per-socket=N                                    -> job_desc.tres_per_socket
  (Slurm before 21.08: job_desc.gres)

Checking only --gres misses --gpus=N. Items look like "gres:gpu:2" (22.05), "gres/gpu:2"
(23.02+), "gres/gpu:a100:2", "gpu:2" or "gpu" (one). Per-node, per-task and per-socket counts
are multiplied by the node / task / socket counts when the job gives them (unknown counts
count as 1, a lower bound). Written for Lua 5.1 (slurmctld) and 5.3.
--]]

local MAX_GPUS_PER_JOB = 8     -- the cap; keep it equal to the policy file's limit

local UNKNOWN = 65534          -- NO_VAL16; NO_VAL (4294967294) is larger still

-- GPUs named by one TRES string such as "gres:gpu:2,gres/gpu:a100:1,cpu:4".
local function gpus_in(tres)
   if tres == nil or tres == "" then return 0 end
   local total = 0
   for item in string.gmatch(tres, "[^,]+") do
      local rest = string.match(item, "^gres[:/]gpu(.*)$") or string.match(item, "^gpu(.*)$")
      if rest ~= nil and (rest == "" or string.sub(rest, 1, 1) == ":") then
         local count = string.match(rest, ":(%d+)$")
         if count == nil then
            -- "gpu" or "gpu:type" alone means one GPU
            if string.match(rest, "^:?[%a][%w_%-]*$") or rest == "" then count = "1" end
         end
         total = total + (tonumber(count) or 0)
      end
   end
   return total
end

local function known(n)
   if n == nil or n >= UNKNOWN or n == 0 then return nil end
   return n
end

-- Total GPUs the job asks for, and a note saying how it was counted.
function smartlaunch_gpus_requested(job_desc)
   local nodes = known(job_desc.min_nodes) or 1
   local tasks = known(job_desc.num_tasks)
   if tasks == nil and known(job_desc.ntasks_per_node) then
      tasks = job_desc.ntasks_per_node * nodes
   end
   tasks = tasks or 1
   local sockets = (known(job_desc.sockets_per_node) or 1) * nodes
   local counts = {
      { gpus_in(job_desc.tres_per_job), 1, "--gpus" },
      { gpus_in(job_desc.tres_per_node), nodes, "--gres/--gpus-per-node" },
      { gpus_in(job_desc.tres_per_task), tasks, "--gpus-per-task" },
      { gpus_in(job_desc.tres_per_socket), sockets, "--gpus-per-socket" },
   }
   -- Slurm before 21.08 kept --gres in job_desc.gres (per node); newer ones mirror it.
   if job_desc.tres_per_node == nil then
      table.insert(counts, { gpus_in(job_desc.gres), nodes, "--gres" })
   end
   local worst, how = 0, ""
   for _, c in ipairs(counts) do
      local n = c[1] * c[2]
      if n > worst then worst, how = n, string.format("%s: %d x %d", c[3], c[1], c[2]) end
   end
   return worst, how
end

local function check(job_desc)
   local n, how = smartlaunch_gpus_requested(job_desc)
   if n > MAX_GPUS_PER_JOB then
      slurm.log_user(string.format(
         "smartlaunch policy: this job asks for %d GPUs (%s); the limit is %d per job. " ..
         "Ask for at most %d, or ask the admins to raise MAX_GPUS_PER_JOB.",
         n, how, MAX_GPUS_PER_JOB, MAX_GPUS_PER_JOB))
      slurm.log_info("smartlaunch: rejected job of uid %s: %d GPUs (%s) > %d",
                     tostring(job_desc.user_id), n, how, MAX_GPUS_PER_JOB)
      return slurm.ERROR
   end
   return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   return check(job_desc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return check(job_desc)
end

return slurm.SUCCESS
