{{/*
Rules that span several values, each failing with a sentence that says what to
change. Shapes, types, ranges and required values are in values.schema.json.
*/}}
{{- define "statefleet.validate" -}}
{{- if include "statefleet.usesSasl" . -}}
{{- $workloads := list -}}
{{- range $svc := include "statefleet.serviceCatalog" . | fromYamlArray -}}
{{- if (include "statefleet.serviceValues" (dict "ctx" $ "key" $svc.key) | fromYaml).enabled -}}
{{- $workloads = append $workloads $svc.key -}}
{{- end -}}
{{- end -}}
{{- if .Values.topics.create.enabled -}}{{- $workloads = append $workloads "topics" -}}{{- end -}}
{{- if include "statefleet.spark.anyJob" . -}}{{- $workloads = append $workloads "spark" -}}{{- end -}}
{{- range $workload := $workloads -}}
{{- if not (include "statefleet.saslSecret" (dict "ctx" $ "workload" $workload)) -}}
{{- fail (printf "kafka.securityProtocol is %s but %s has no SASL credentials: set kafka.sasl.existingSecret (every workload), or kafka.sasl.workloadSecrets.%s (its own principal), to the name of a Secret holding the username and password" $.Values.kafka.securityProtocol $workload $workload) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if include "statefleet.spark.anyJob" . -}}
{{- $podsElsewhere := or (eq .Values.spark.mode "cluster") (include "statefleet.spark.operator" .) -}}
{{- if and $podsElsewhere (include "statefleet.spark.storageEnabled" .) (not (include "statefleet.spark.storageShared" .)) -}}
{{- fail "spark: executors run in pods of their own and write checkpoints and output to the Spark volume too; set spark.storage.accessModes to [ReadWriteMany], or spark.storage.existingClaim to a claim every pod can mount, or turn spark.storage off and give spark.checkpointDir, spark.archiveDir and spark.backfillDir as shared URLs (hdfs://...)" -}}
{{- end -}}
{{- if and (not (include "statefleet.spark.storageEnabled" .)) (not (and .Values.spark.checkpointDir .Values.spark.archiveDir .Values.spark.backfillDir)) -}}
{{- fail "spark: spark.storage is off, so spark.checkpointDir, spark.archiveDir and spark.backfillDir must all be set (the image's filesystem is read-only)" -}}
{{- end -}}
{{- end -}}
{{- if .Values.topics.create.enabled -}}
{{- $rf := int .Values.topics.replicationFactor -}}
{{- $all := dict "topics.create.defaultConfigs" (default dict .Values.topics.create.defaultConfigs) -}}
{{- range $topic, $configs := .Values.topics.create.topics -}}
{{- $_ := set $all (printf "topics.create.topics.%s" $topic) (default dict $configs) -}}
{{- end -}}
{{- range $where, $configs := $all -}}
{{- $isr := index $configs "min.insync.replicas" -}}
{{- if and $isr (gt (int $isr) $rf) -}}
{{- fail (printf "%s: min.insync.replicas %v is more than topics.replicationFactor %d, so no write with acks=all could succeed; lower it or raise the replication factor" $where $isr $rf) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
