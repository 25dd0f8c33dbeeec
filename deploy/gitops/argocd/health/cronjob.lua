-- Argo CD health of a batch/CronJob. The Berth agent suspends a managed
-- CronJob while its cluster does not hold the lease (annotation
-- berth.skaphos.io/lease-state: standby), and at a takeover records the
-- takeover as the CronJob's last schedule (annotation
-- berth.skaphos.io/resumed-at, the same time), so that the schedule the
-- previous holder ran is not run twice. Both are healthy states. Otherwise
-- the rules of Argo CD's built-in CronJob check apply (restated here, since
-- a health customization replaces it): healthy unless its last run failed.
local annotations = obj.metadata.annotations or {}
local status = obj.status or {}
if annotations["berth.skaphos.io/lease-state"] == "standby" then
  local message = "standby: suspended while the workload runs in another cluster"
  if annotations["berth.skaphos.io/holder"] ~= nil then
    message = "standby: suspended while held by " .. annotations["berth.skaphos.io/holder"] .. " with fencing token " .. (annotations["berth.skaphos.io/fencing-token"] or "?")
  end
  return {status = "Healthy", message = message}
end
if obj.spec.suspend == true then
  return {status = "Healthy", message = "suspended"}
end
if obj.status == nil then
  return {status = "Progressing", message = "the CronJob controller has not seen it yet"}
end
local resumed = annotations["berth.skaphos.io/resumed-at"]
if resumed ~= nil and resumed == status.lastScheduleTime then
  return {status = "Healthy", message = "resumed when this cluster took the lease over (" .. resumed .. "); no schedule has come since"}
end
if status.lastScheduleTime == nil then
  return {status = "Healthy", message = "no schedule has come yet"}
end
if status.lastSuccessfulTime == nil then
  return {status = "Healthy", message = "no run has succeeded yet"}
end
if status.active ~= nil and #status.active > 0 then
  return {status = "Healthy", message = #status.active .. " Job(s) running"}
end
if status.lastSuccessfulTime < status.lastScheduleTime then
  return {status = "Degraded", message = "the last run, scheduled at " .. status.lastScheduleTime .. ", did not succeed"}
end
return {status = "Healthy", message = "the last run, scheduled at " .. status.lastScheduleTime .. ", succeeded"}
