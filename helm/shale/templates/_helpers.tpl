{{/* Names and labels shared by every template. */}}

{{- define "shale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; every object name starts with it (at most 40 characters, so that "<fullname>-storage" stays a valid StatefulSet name). */}}
{{- define "shale.fullname" -}}
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

{{- define "shale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "shale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shale.labels" -}}
helm.sh/chart: {{ include "shale.chart" . }}
{{ include "shale.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shale
{{- end -}}

{{- define "shale.operatorName" -}}{{ include "shale.fullname" . }}-operator{{- end -}}
{{- define "shale.storageName" -}}{{ include "shale.fullname" . }}-storage{{- end -}}
{{- define "shale.headlessName" -}}{{ include "shale.fullname" . }}-storage-headless{{- end -}}
{{/* The bootstrap Service clients connect to: <fullname>.<namespace>.svc:<kafkaPort>. */}}
{{- define "shale.clientServiceName" -}}{{ include "shale.fullname" . }}{{- end -}}

{{/* The storage pods' ServiceAccount (their Lease rights with replication; templates/rbac-storage.yaml). */}}
{{- define "shale.storageServiceAccountName" -}}
{{- if .Values.storage.serviceAccount.create -}}
{{- default (include "shale.storageName" .) .Values.storage.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.storage.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The replication factor the operator gives a Topic without spec.replicas: 1 without replication. */}}
{{- define "shale.defaultReplicas" -}}
{{- ternary .Values.operator.defaultReplicas 1 .Values.storage.replication.enabled -}}
{{- end -}}

{{- define "shale.topicsConfigMap" -}}
{{- default (printf "%s-topics" (include "shale.fullname" .)) .Values.storage.topicsConfigMap -}}
{{- end -}}

{{- define "shale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shale.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shale.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.registry -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Namespaces whose Topics the operator reconciles: watchNamespaces, or the release namespace. */}}
{{- define "shale.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The advertised-host suffix after the pod name: .<headless>.<namespace>.svc[.<clusterDomain>] */}}
{{- define "shale.podDomain" -}}
{{- printf ".%s.%s.svc" (include "shale.headlessName" .) .Release.Namespace -}}
{{- with .Values.storage.clusterDomain -}}.{{ . }}{{- end -}}
{{- end -}}

{{/* The operator's rules on Topics, in each namespace it reconciles (templates/rbac.yaml). */}}
{{- define "shale.topicRules" }}
  # Watch Topics (kopf lists and watches; it never reads one by name), and patch them: kopf's finalizer
  # and its annotations (last handled spec, progress). No topics/finalizers: that subresource guards
  # ownerReferences (OwnerReferencesPermissionEnforcement), which the operator never sets.
  - apiGroups: ["shale.dev"]
    resources: ["topics"]
    verbs: ["list", "watch", "patch"]
  # Write status (observedGeneration, conditions, partitions, diskUsageBytes) through the subresource.
  - apiGroups: ["shale.dev"]
    resources: ["topics/status"]
    verbs: ["patch"]
  # Post Events about a Topic: a spec it cannot apply (InvalidConfig, ...), a handler that failed.
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
{{- end }}

{{/* The operator's rules on Users, in each namespace it reconciles (templates/rbac.yaml, operator/user_handlers.py). */}}
{{- define "shale.userRules" }}
  # Watch Users and patch them (kopf's finalizer: a deleted User's credential and ACLs leave the pods first).
  - apiGroups: ["shale.dev"]
    resources: ["users"]
    verbs: ["list", "watch", "patch"]
  - apiGroups: ["shale.dev"]
    resources: ["users/status"]
    verbs: ["patch"]
  # Each User's Secret (named like the User): read, created with the password or certificate, completed.
  # RBAC cannot limit these to names not known ahead: any Secret of these namespaces.
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["get", "create", "patch"]
{{- end }}

{{/* Security (docs/security.md): the Secrets of TLS material and the HTTP token; given, or generated on install. */}}
{{- define "shale.clusterCASecret" -}}{{ include "shale.fullname" . }}-cluster-ca{{- end -}}
{{- define "shale.storageTLSSecret" -}}
{{- default (printf "%s-storage-tls" (include "shale.fullname" .)) .Values.security.tls.storageSecret -}}
{{- end -}}
{{- define "shale.operatorTLSSecret" -}}
{{- default (printf "%s-operator-tls" (include "shale.fullname" .)) .Values.security.tls.operatorSecret -}}
{{- end -}}
{{- define "shale.clientsCASecret" -}}
{{- default (printf "%s-clients-ca" (include "shale.fullname" .)) .Values.security.tls.clientsCASecret -}}
{{- end -}}
{{- define "shale.httpTokenSecret" -}}
{{- default (printf "%s-http-token" (include "shale.fullname" .)) .Values.security.httpTokenSecret -}}
{{- end -}}
{{/* The principals of the generated certificates (CN=<name>, Kafka's default principal mapping). */}}
{{- define "shale.storagePrincipal" -}}User:CN={{ include "shale.storageName" . }}{{- end -}}
{{- define "shale.operatorPrincipal" -}}User:CN={{ include "shale.operatorName" . }}{{- end -}}

{{/* The storage nodes' `--override`s for listeners, TLS, SASL and ACLs (security.enabled). Paths only: no secret. */}}
{{- define "shale.securityOverrides" -}}
{{- $s := .Values.storage -}}
{{- $sec := .Values.security -}}
{{- $superUsers := concat (list (include "shale.storagePrincipal" .) (include "shale.operatorPrincipal" .)) $sec.superUsers -}}
listeners: {{ printf "INTERNAL://0.0.0.0:%v,CLIENT://0.0.0.0:%v,CLIENTTLS://0.0.0.0:%v" $sec.internalPort $s.kafkaPort $sec.tlsClientPort | quote }}
advertised.listeners: {{ printf "INTERNAL://:%v,CLIENT://:%v,CLIENTTLS://:%v" $sec.internalPort $s.kafkaPort $sec.tlsClientPort | quote }}
listener.security.protocol.map: "INTERNAL:SSL,CLIENT:SASL_SSL,CLIENTTLS:SSL"
inter.broker.listener.name: "INTERNAL"
ssl.keystore.location: "/etc/shale/tls/tls.crt"
ssl.keystore.key.location: "/etc/shale/tls/tls.key"
ssl.truststore.location: "/etc/shale/tls/ca.crt"
listener.name.internal.ssl.client.auth: "required"
listener.name.clienttls.ssl.client.auth: "required"
listener.name.clienttls.ssl.truststore.location: "/etc/shale/clients-ca/tls.crt"
sasl.enabled.mechanisms: "SCRAM-SHA-512"
authorizer.class.name: "shale"
super.users: {{ join ";" $superUsers | quote }}
{{- end -}}
