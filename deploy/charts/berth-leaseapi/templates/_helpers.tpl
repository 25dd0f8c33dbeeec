{{/* The release's full name: the release name, or release-chart when they differ. */}}
{{- define "berth-leaseapi.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "berth-leaseapi.selectorLabels" -}}
app.kubernetes.io/name: berth-leaseapi
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "berth-leaseapi.labels" -}}
{{ include "berth-leaseapi.selectorLabels" . }}
app.kubernetes.io/part-of: berth
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "berth-leaseapi.serviceAccountName" -}}
{{- default (include "berth-leaseapi.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "berth-leaseapi.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "berth-leaseapi.tlsSecret" -}}
{{- if eq .Values.tls.mode "certManager" -}}
{{- printf "%s-tls" (include "berth-leaseapi.fullname" .) -}}
{{- else -}}
{{- .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "berth-leaseapi.coordinationNamespace" -}}
{{- default .Release.Namespace .Values.store.kubernetes.namespace -}}
{{- end -}}

{{/* The number of replicas: the embedded store runs exactly one. */}}
{{- define "berth-leaseapi.replicas" -}}
{{- if eq .Values.store.type "sqlite" -}}1{{- else -}}{{ .Values.replicaCount }}{{- end -}}
{{- end -}}

{{/* The Pod template, shared by the StatefulSet (sqlite) and the Deployment. */}}
{{- define "berth-leaseapi.podTemplate" -}}
metadata:
  labels:
    {{- include "berth-leaseapi.labels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    kubectl.kubernetes.io/default-container: leaseapi
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "berth-leaseapi.serviceAccountName" . }}
  automountServiceAccountToken: {{ eq .Values.store.type "kubernetes" }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: leaseapi
      image: {{ include "berth-leaseapi.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - --listen=:8443
        - --metrics-listen=:{{ .Values.metrics.port }}
        - --store={{ .Values.store.type }}
        {{- if eq .Values.store.type "sqlite" }}
        - --sqlite-path=/var/lib/berth/leases.db
        {{- else if eq .Values.store.type "postgres" }}
        - --postgres-dsn-file=/var/run/berth/postgres/{{ .Values.store.postgres.dsnSecret.key }}
        - --postgres-migrate={{ .Values.store.postgres.migrate }}
        {{- else }}
        - --coordination-namespace={{ include "berth-leaseapi.coordinationNamespace" . }}
        {{- end }}
        - --tls-cert-file=/var/run/berth/tls/tls.crt
        - --tls-key-file=/var/run/berth/tls/tls.key
        - --token-file=/var/run/berth/tokens/{{ .Values.auth.tokens.key }}
        {{- with .Values.auth.adminSubjects }}
        - --admin-subjects={{ join "," . }}
        {{- end }}
        {{- if .Values.auth.clientCA.existingSecret }}
        - --client-ca-file=/var/run/berth/client-ca/{{ .Values.auth.clientCA.key }}
        {{- end }}
        {{- if .Values.auth.serviceAccountKeys.existingConfigMap }}
        - --service-account-keys-dir=/var/run/berth/service-account-keys
        {{- end }}
        - --log-format={{ .Values.logging.format }}
        - --v={{ .Values.logging.verbosity }}
        {{- range .Values.extraArgs }}
        - {{ . }}
        {{- end }}
      ports:
        - name: https
          containerPort: 8443
          protocol: TCP
        - name: metrics
          containerPort: {{ .Values.metrics.port }}
          protocol: TCP
      livenessProbe:
        httpGet:
          path: /healthz
          port: https
          scheme: HTTPS
        periodSeconds: 10
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: https
          scheme: HTTPS
        periodSeconds: 5
        failureThreshold: 3
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: tls
          mountPath: /var/run/berth/tls
          readOnly: true
        - name: tokens
          mountPath: /var/run/berth/tokens
          readOnly: true
        {{- if .Values.auth.clientCA.existingSecret }}
        - name: client-ca
          mountPath: /var/run/berth/client-ca
          readOnly: true
        {{- end }}
        {{- if .Values.auth.serviceAccountKeys.existingConfigMap }}
        - name: service-account-keys
          mountPath: /var/run/berth/service-account-keys
          readOnly: true
        {{- end }}
        {{- if eq .Values.store.type "sqlite" }}
        - name: data
          mountPath: /var/lib/berth
        {{- else if eq .Values.store.type "postgres" }}
        - name: postgres
          mountPath: /var/run/berth/postgres
          readOnly: true
        {{- end }}
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tls
      secret:
        secretName: {{ include "berth-leaseapi.tlsSecret" . }}
    - name: tokens
      secret:
        secretName: {{ .Values.auth.tokens.existingSecret }}
    {{- if .Values.auth.clientCA.existingSecret }}
    - name: client-ca
      secret:
        secretName: {{ .Values.auth.clientCA.existingSecret }}
    {{- end }}
    {{- if .Values.auth.serviceAccountKeys.existingConfigMap }}
    - name: service-account-keys
      configMap:
        name: {{ .Values.auth.serviceAccountKeys.existingConfigMap }}
    {{- end }}
    {{- if eq .Values.store.type "postgres" }}
    - name: postgres
      secret:
        secretName: {{ .Values.store.postgres.dsnSecret.name }}
    {{- end }}
    - name: tmp
      emptyDir:
        sizeLimit: 16Mi
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  affinity:
    {{- if .Values.affinity }}
    {{- toYaml .Values.affinity | nindent 4 }}
    {{- else }}
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels:
                {{- include "berth-leaseapi.selectorLabels" . | nindent 16 }}
    {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
