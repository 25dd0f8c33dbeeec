{{/* The release's full name: the release name, or release-chart when they differ. */}}
{{- define "berth-agent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "berth-agent.selectorLabels" -}}
app.kubernetes.io/name: berth-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "berth-agent.labels" -}}
{{ include "berth-agent.selectorLabels" . }}
app.kubernetes.io/part-of: berth
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "berth-agent.serviceAccountName" -}}
{{- default (include "berth-agent.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The agent's user name: admission reserves ungating managed Pods to it. */}}
{{- define "berth-agent.user" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "berth-agent.serviceAccountName" . }}
{{- end -}}

{{- define "berth-agent.webhookService" -}}
{{- printf "%s-webhook" (include "berth-agent.fullname" .) -}}
{{- end -}}

{{/*
The webhook's certificate Secret. The agent's own (mode agent) has a fixed name: its rights
to read and rotate it are generated from the markers in the Go code, by that name.
*/}}
{{- define "berth-agent.webhookCertSecret" -}}
{{- if eq .Values.webhook.certificates.mode "secret" -}}
{{- .Values.webhook.certificates.secret.name -}}
{{- else if eq .Values.webhook.certificates.mode "certManager" -}}
{{- printf "%s-webhook-tls" (include "berth-agent.fullname" .) -}}
{{- else -}}
berth-agent-webhook-tls
{{- end -}}
{{- end -}}

{{- define "berth-agent.tokenSecret" -}}
{{- default (printf "%s-lease-api-token" (include "berth-agent.fullname" .)) .Values.leaseApi.token.existingSecret -}}
{{- end -}}

{{- define "berth-agent.caConfigMap" -}}
{{- default (printf "%s-lease-api-ca" (include "berth-agent.fullname" .)) .Values.leaseApi.ca.existingConfigMap -}}
{{- end -}}

{{- define "berth-agent.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Annotations of the webhook registrations: cert-manager's CA injector in its mode. */}}
{{- define "berth-agent.webhookAnnotations" -}}
{{- if eq .Values.webhook.certificates.mode "certManager" -}}
cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "berth-agent.webhookService" . }}
{{- else -}}
berth.skaphos.io/ca-bundle-from: {{ .Values.webhook.certificates.mode }}
{{- end -}}
{{- end -}}

{{/* validate fails the render with a message naming the value to set. */}}
{{- define "berth-agent.validate" -}}
{{- if not .Values.leaseApi.url -}}
{{- fail "leaseApi.url is required: the lease API's URL, e.g. https://berth-leaseapi.example.com:8443" -}}
{{- end -}}
{{- if not (or .Values.leaseApi.token.existingSecret .Values.leaseApi.token.value) -}}
{{- fail "leaseApi.token: set existingSecret (a Secret holding this cluster's lease API token) or value" -}}
{{- end -}}
{{- include "berth-agent.validateUpgrade" . -}}
{{- if and .Values.managedWorkloads (eq .Values.webhook.certificates.mode "secret") -}}
{{- if not (and .Values.webhook.certificates.secret.name .Values.webhook.certificates.secret.caBundle) -}}
{{- fail "webhook.certificates.mode secret needs webhook.certificates.secret.name (a kubernetes.io/tls Secret) and webhook.certificates.secret.caBundle (its CA, PEM)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
validateUpgrade refuses the upgrades that would leave managed Pods running with nobody to
stop them (docs/install.md, Upgrades). It reads the running Deployment, so `helm template`
(no cluster) skips it; allowUnsafeUpgrade skips it too.
*/}}
{{- define "berth-agent.validateUpgrade" -}}
{{- $running := lookup "apps/v1" "Deployment" .Release.Namespace (include "berth-agent.fullname" .) -}}
{{- if and $running (not .Values.allowUnsafeUpgrade) -}}
{{- $sa := $running.spec.template.spec.serviceAccountName | default "" -}}
{{- if and $sa (ne $sa (include "berth-agent.serviceAccountName" .)) -}}
{{- fail (printf "serviceAccount.name cannot change in an upgrade (the running agent is %s): the running agent would lose its rights at once, while its managed Pods may run. Cordon the cluster until it holds no lease (berthctl cordon <cluster>), uninstall, install again, uncordon" $sa) -}}
{{- end -}}
{{- $args := (index $running.spec.template.spec.containers 0).args | default list -}}
{{- if and (has "--managed-workloads" $args) (not .Values.managedWorkloads) -}}
{{- fail "managedWorkloads cannot be turned off in an upgrade: the agent would then release its leases without stopping the managed Pods it let run. Cordon the cluster until it holds no lease (berthctl cordon <cluster>), then upgrade with --set allowUnsafeUpgrade=true" -}}
{{- end -}}
{{- end -}}
{{- end -}}
