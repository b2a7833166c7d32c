{{/*
Spark jobs. In local mode a job is one pod running local[N]. In cluster mode
the job's pod is the driver (client mode) and its executors run on
spark.cluster.master: with a k8s:// master they are pods of this release,
created from the executor pod template in the spark ConfigMap.
Settings reach the jobs through STATEFLEET_SPARK_* variables (spark_jobs.config),
$SPARK_CONF_DIR/spark-defaults.conf (static Spark settings) and
PYSPARK_SUBMIT_ARGS (the ones that depend on the pod: its name and IP).
*/}}

{{- define "statefleet.spark.master" -}}
{{- if eq .Values.spark.mode "local" -}}
{{- printf "local[%d]" (int .Values.spark.localCores) -}}
{{- else -}}
{{- .Values.spark.cluster.master -}}
{{- end -}}
{{- end -}}

{{/* Whether executors are Kubernetes pods created by the driver (cluster mode with a k8s:// master). */}}
{{- define "statefleet.spark.onKubernetes" -}}
{{- if and (eq .Values.spark.mode "cluster") (hasPrefix "k8s://" .Values.spark.cluster.master) -}}true{{- end -}}
{{- end -}}

{{/* Whether any batch job is enabled. */}}
{{- define "statefleet.spark.anyBatch" -}}
{{- range $_, $job := .Values.spark.batch.jobs -}}
{{- if $job.enabled -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "statefleet.spark.anyJob" -}}
{{- if or .Values.spark.join.enabled (include "statefleet.spark.anyBatch" .) -}}true{{- end -}}
{{- end -}}

{{/* Whether the join runs as a SparkApplication. */}}
{{- define "statefleet.spark.operator" -}}
{{- if and .Values.spark.join.enabled (eq .Values.spark.join.runner "sparkApplication") -}}true{{- end -}}
{{- end -}}

{{/* Whether a Spark ServiceAccount with RBAC is needed: drivers that create executor pods, or the Spark operator's driver. */}}
{{- define "statefleet.spark.needsRbac" -}}
{{- if or (and (include "statefleet.spark.anyJob" .) (include "statefleet.spark.onKubernetes" .)) (include "statefleet.spark.operator" .) -}}true{{- end -}}
{{- end -}}

{{- define "statefleet.spark.serviceAccountName" -}}
{{- printf "%s-spark" (include "statefleet.fullname" .) -}}
{{- end -}}

{{- define "statefleet.spark.confName" -}}
{{- printf "%s-spark" (include "statefleet.fullname" .) -}}
{{- end -}}

{{- define "statefleet.spark.storageMount" -}}/var/lib/statefleet-spark{{- end -}}

{{/* Whether the Spark storage volume is mounted (a claim the chart creates or an existing one). */}}
{{- define "statefleet.spark.storageEnabled" -}}
{{- if and (include "statefleet.spark.anyJob" .) (or .Values.spark.storage.enabled .Values.spark.storage.existingClaim) -}}true{{- end -}}
{{- end -}}

{{- define "statefleet.spark.storageClaim" -}}
{{- default (printf "%s-spark" (include "statefleet.fullname" .)) .Values.spark.storage.existingClaim -}}
{{- end -}}

{{/* Whether pods on different nodes can mount the storage volume (ReadWriteMany, or an existing claim the operator vouches for). */}}
{{- define "statefleet.spark.storageShared" -}}
{{- if or .Values.spark.storage.existingClaim (has "ReadWriteMany" .Values.spark.storage.accessModes) -}}true{{- end -}}
{{- end -}}

{{/* A job folder: the value when set, else <storage>/<folder>. Call with (dict "ctx" $ "value" X "folder" NAME). */}}
{{- define "statefleet.spark.dir" -}}
{{- if .value -}}
{{- .value -}}
{{- else -}}
{{- printf "%s/%s" (include "statefleet.spark.storageMount" .ctx) .folder -}}
{{- end -}}
{{- end -}}

{{/* STATEFLEET_SPARK_* folders and settings every Spark container (driver or executor) gets. */}}
{{- define "statefleet.spark.jobEnv" -}}
- name: STATEFLEET_SPARK_CHECKPOINT_DIR
  value: {{ include "statefleet.spark.dir" (dict "ctx" . "value" .Values.spark.checkpointDir "folder" "checkpoints") | quote }}
- name: STATEFLEET_SPARK_ARCHIVE_DIR
  value: {{ include "statefleet.spark.dir" (dict "ctx" . "value" .Values.spark.archiveDir "folder" "archive") | quote }}
- name: STATEFLEET_SPARK_BACKFILL_DIR
  value: {{ include "statefleet.spark.dir" (dict "ctx" . "value" .Values.spark.backfillDir "folder" "backfill") | quote }}
- name: STATEFLEET_SPARK_LOCAL_DIR
  value: /tmp/spark-local
- name: STATEFLEET_SPARK_WAREHOUSE_DIR
  value: /tmp/spark-warehouse
{{- range $name, $value := .Values.spark.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/*
Environment of a Spark driver container: call with (dict "ctx" $ "join" BOOL).
*/}}
{{- define "statefleet.spark.env" -}}
{{- $ := .ctx -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: STATEFLEET_SPARK_MASTER
  value: {{ include "statefleet.spark.master" $ | quote }}
- name: SPARK_CONF_DIR
  value: /etc/statefleet/spark
{{- if .join }}
# The driver's liveness is checked on the Spark UI port.
- name: STATEFLEET_SPARK_UI_ENABLED
  value: "true"
{{- end }}
{{- if eq $.Values.spark.mode "cluster" }}
{{- $args := list "--conf spark.driver.host=$(POD_IP)" }}
{{- if include "statefleet.spark.onKubernetes" $ }}
{{- $args = append $args "--conf spark.kubernetes.driver.pod.name=$(POD_NAME)" }}
{{- if include "statefleet.spark.storageEnabled" $ }}
{{- $pvc := "spark.kubernetes.executor.volumes.persistentVolumeClaim.spark-storage" }}
{{- $args = append $args (printf "--conf %s.options.claimName=%s" $pvc (include "statefleet.spark.storageClaim" $)) }}
{{- $args = append $args (printf "--conf %s.mount.path=%s" $pvc (include "statefleet.spark.storageMount" $)) }}
{{- end }}
{{- end }}
- name: PYSPARK_SUBMIT_ARGS
  value: {{ printf "%s pyspark-shell" (join " " $args) | quote }}
{{- end }}
{{ include "statefleet.spark.jobEnv" $ }}
{{ include "statefleet.kafkaEnv" (dict "ctx" $ "workload" "spark") }}
{{- end -}}

{{/* Volumes of a Spark driver pod. */}}
{{- define "statefleet.spark.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.spark.tmpSizeLimit }}
- name: spark-conf
  configMap:
    name: {{ include "statefleet.spark.confName" . }}
{{- if include "statefleet.spark.storageEnabled" . }}
- name: spark-storage
  persistentVolumeClaim:
    claimName: {{ include "statefleet.spark.storageClaim" . }}
{{- end }}
{{- with (include "statefleet.kafkaVolumes" .) }}
{{ . }}
{{- end }}
{{- end -}}

{{- define "statefleet.spark.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: spark-conf
  mountPath: /etc/statefleet/spark
  readOnly: true
{{- if include "statefleet.spark.storageEnabled" . }}
- name: spark-storage
  mountPath: {{ include "statefleet.spark.storageMount" . }}
{{- end }}
{{- with (include "statefleet.kafkaVolumeMounts" .) }}
{{ . }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount a Spark driver pod runs as, and whether it gets a token (only to create executor pods). */}}
{{- define "statefleet.spark.podIdentity" -}}
{{- if include "statefleet.spark.onKubernetes" . }}
serviceAccountName: {{ include "statefleet.spark.serviceAccountName" . }}
automountServiceAccountToken: true
{{- else }}
serviceAccountName: {{ include "statefleet.serviceAccountName" . }}
automountServiceAccountToken: false
{{- end }}
{{- end -}}

{{/*
Affinity of batch job pods: with a ReadWriteOnce storage volume that the join's
driver (a Deployment) holds, a batch pod must run on the same node to mount it.
*/}}
{{- define "statefleet.spark.batchAffinity" -}}
{{- if and (include "statefleet.spark.storageEnabled" .) (not (include "statefleet.spark.storageShared" .)) .Values.spark.join.enabled (eq .Values.spark.join.runner "deployment") -}}
podAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "statefleet.componentSelectorLabels" (dict "ctx" . "component" "activation-join") | nindent 10 }}
{{- end -}}
{{- end -}}

{{/* Annotations of a Spark driver workload (a linter exception where the driver needs its token). */}}
{{- define "statefleet.spark.workloadAnnotations" -}}
{{- if include "statefleet.spark.onKubernetes" . -}}
checkov.io/skip1: CKV_K8S_38=The Spark driver creates its executor pods through the Kubernetes API and needs its ServiceAccount token
{{- end -}}
{{- end -}}
