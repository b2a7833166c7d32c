{{/*
Names, labels and the pieces every workload shares: image, security contexts,
Kafka connection (env and volumes), admin token, service settings.
*/}}

{{- define "statefleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "statefleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "statefleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "statefleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "statefleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "statefleet.labels" -}}
helm.sh/chart: {{ include "statefleet.chart" . }}
{{ include "statefleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: statefleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component: call with (dict "ctx" $ "component" "tallies"). */}}
{{- define "statefleet.componentLabels" -}}
{{ include "statefleet.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "statefleet.componentSelectorLabels" -}}
{{ include "statefleet.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Name of a component's resources; at most 52 characters so StatefulSet pod labels fit. */}}
{{- define "statefleet.componentName" -}}
{{- printf "%s-%s" (include "statefleet.fullname" .ctx) .component | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "statefleet.headlessName" -}}
{{- printf "%s-headless" (include "statefleet.componentName" .) -}}
{{- end -}}

{{- define "statefleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "statefleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "statefleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "statefleet.adminSecretName" -}}
{{- default (printf "%s-admin" (include "statefleet.fullname" .)) .Values.admin.existingSecret -}}
{{- end -}}

{{/*
The services in a fixed order, as a YAML list of {key, name, module}: key is the
entry under .Values.services, name the component name, module what the image runs.
*/}}
{{- define "statefleet.serviceCatalog" -}}
- key: tallies
  name: tallies
  module: services.tallies
- key: validator
  name: validator
  module: services.validator
- key: retryScheduler
  name: retry-scheduler
  module: services.retry_scheduler
{{- end -}}

{{/* One service's settings: serviceDefaults overridden by services.<key>. Call with (dict "ctx" $ "key" "tallies"). */}}
{{- define "statefleet.serviceValues" -}}
{{- $defaults := deepCopy .ctx.Values.serviceDefaults -}}
{{- $own := deepCopy (index .ctx.Values.services .key) -}}
{{- toYaml (mergeOverwrite $defaults $own) -}}
{{- end -}}

{{- define "statefleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
fsGroup: {{ .Values.security.fsGroup }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "statefleet.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.security.runAsUser }}
runAsGroup: {{ .Values.security.runAsGroup }}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "statefleet.usesSasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol -}}true{{- end -}}
{{- end -}}

{{- define "statefleet.usesTls" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") -}}true{{- end -}}
{{- end -}}

{{/* Whether a Kafka TLS Secret is mounted. */}}
{{- define "statefleet.mountsTls" -}}
{{- if and (include "statefleet.usesTls" .) .Values.kafka.tls.existingSecret -}}true{{- end -}}
{{- end -}}

{{/*
The Secret with a workload's SASL credentials: its own under kafka.sasl.workloadSecrets,
else the release's kafka.sasl.existingSecret. Call with (dict "ctx" $ "workload" "tallies").
*/}}
{{- define "statefleet.saslSecret" -}}
{{- $own := get (.ctx.Values.kafka.sasl.workloadSecrets | default dict) .workload -}}
{{- default .ctx.Values.kafka.sasl.existingSecret $own -}}
{{- end -}}

{{/*
Environment of every container that talks to Kafka: connection, credentials
(only as references to the named Secrets), topics, logging. Call with
(dict "ctx" $ "workload" "tallies"): the workload (a service's key, "topics" or "spark")
picks the SASL Secret, so that each connects as a principal of its own.
*/}}
{{- define "statefleet.kafkaEnv" -}}
{{- $sasl := include "statefleet.saslSecret" . -}}
{{- with .ctx -}}
- name: STATEFLEET_KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
- name: STATEFLEET_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if include "statefleet.usesSasl" . }}
- name: STATEFLEET_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: STATEFLEET_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $sasl }}
      key: {{ .Values.kafka.sasl.usernameKey }}
- name: STATEFLEET_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $sasl }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if include "statefleet.mountsTls" . }}
- name: STATEFLEET_KAFKA_SSL_CAFILE
  value: {{ printf "%s/%s" .Values.kafka.tls.mountPath .Values.kafka.tls.caKey | quote }}
{{- if .Values.kafka.tls.certKey }}
- name: STATEFLEET_KAFKA_SSL_CERTFILE
  value: {{ printf "%s/%s" .Values.kafka.tls.mountPath .Values.kafka.tls.certKey | quote }}
- name: STATEFLEET_KAFKA_SSL_KEYFILE
  value: {{ printf "%s/%s" .Values.kafka.tls.mountPath .Values.kafka.tls.keyKey | quote }}
{{- end }}
{{- end }}
- name: STATEFLEET_TOPIC_PREFIX
  value: {{ .Values.topics.prefix | quote }}
- name: STATEFLEET_TOPIC_PARTITIONS
  value: {{ .Values.topics.partitions | quote }}
- name: STATEFLEET_TOPIC_REPLICATION_FACTOR
  value: {{ .Values.topics.replicationFactor | quote }}
- name: STATEFLEET_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: HOME
  value: /tmp
{{- end -}}
{{- end -}}

{{- define "statefleet.kafkaVolumes" -}}
{{- if include "statefleet.mountsTls" . -}}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end -}}
{{- end -}}

{{- define "statefleet.kafkaVolumeMounts" -}}
{{- if include "statefleet.mountsTls" . -}}
- name: kafka-tls
  mountPath: {{ .Values.kafka.tls.mountPath }}
  readOnly: true
{{- end -}}
{{- end -}}

{{- define "statefleet.adminTokenEnv" -}}
- name: STATEFLEET_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "statefleet.adminSecretName" . }}
      key: {{ .Values.admin.tokenKey }}
{{- end -}}

{{/* A name: value map as EnvVar objects, in key order. */}}
{{- define "statefleet.envMap" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "statefleet.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* Whether the ServiceMonitor API is to be used. */}}
{{- define "statefleet.serviceMonitorEnabled" -}}
{{- include "statefleet.operatorKindEnabled" (dict "ctx" . "flag" .Values.serviceMonitor.enabled "kind" "ServiceMonitor") -}}
{{- end -}}

{{- define "statefleet.prometheusRuleEnabled" -}}
{{- include "statefleet.operatorKindEnabled" (dict "ctx" . "flag" .Values.prometheusRule.enabled "kind" "PrometheusRule") -}}
{{- end -}}

{{/* "true" when a Prometheus operator object is wanted: flag true, or "auto" and the cluster serves monitoring.coreos.com/v1 kind. */}}
{{- define "statefleet.operatorKindEnabled" -}}
{{- if eq (toString .flag) "true" -}}true
{{- else if and (eq (toString .flag) "auto") (.ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) -}}true
{{- end -}}
{{- end -}}

{{/* The retry scheduler's policy ConfigMap. */}}
{{- define "statefleet.retryPolicyName" -}}
{{- printf "%s-policy" (include "statefleet.componentName" (dict "ctx" . "component" "retry-scheduler")) -}}
{{- end -}}

{{/* The policy file's text from services.retryScheduler.policy (call with the policy). */}}
{{- define "statefleet.retryPolicyFile" -}}
{{- toYaml (dict "rules" .rules) -}}
{{- end -}}
